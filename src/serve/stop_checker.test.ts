/**
 * Stop strings over streamed text, with vLLM's semantics: generation stops at the first delta after
 * which some stop string appears in the text, and the text is cut before the first stop string of the
 * list present at that moment (vLLM's check_stop_strings order; a longer stop string that could only
 * complete later does not count), or after it with include_stop_str_in_output. For any
 * deltas and stop list the released text is exactly that, and every release is a prefix of it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { StopChecker } from './stop_checker.ts';

/** Text as generation grows delta by delta: stop after the first delta that completes a stop string. */
function reference(deltas: string[], stops: string[], includeStop = false): { text: string; stopped: boolean } {
  let text = '';
  for (const d of deltas) {
    text += d;
    for (const s of stops) {
      const at = text.indexOf(s);
      if (at >= 0) return { text: text.slice(0, includeStop ? at + s.length : at), stopped: true };
    }
  }
  return { text, stopped: false };
}

function run(
  deltas: string[],
  stops: string[],
  includeStop = false,
): { text: string; stopped: boolean; releases: string[] } {
  const c = new StopChecker(stops, includeStop);
  const releases: string[] = [];
  let text = '';
  for (const d of deltas) {
    const r = c.push(d);
    text += r.text;
    releases.push(text);
    if (r.stopped) return { text, stopped: true, releases };
  }
  text += c.flush();
  return { text, stopped: false, releases };
}

test('examples: the stop string and what follows are dropped; no stops passes text through at once', () => {
  assert.deepEqual(run(['Hello, wor', 'ld. STO', 'P here'], ['STOP']).text, 'Hello, world. ');
  const c = new StopChecker(['STOP']);
  assert.deepEqual(c.push('Hello, wor'), { text: 'Hello, ', stopped: false }, 'three characters held back');
  assert.deepEqual(new StopChecker([]).push('abc'), { text: 'abc', stopped: false });
  assert.equal(run(['ab', 'c'], ['x']).text, 'abc');
  assert.equal(run(['aXb'], ['b', 'X']).text, 'aX', 'the first listed stop found wins (vLLM), not the earliest');
  assert.equal(run(['aXb'], ['X', 'b']).text, 'a');
  assert.equal(
    run(['Hello, wor', 'ld. STO', 'P here'], ['STOP'], true).text,
    'Hello, world. STOP',
    'include_stop_str_in_output',
  );
});

test('property: streamed stop-string handling equals the delta-by-delta reference (vLLM semantics)', () => {
  const alphabet = fc.constantFrom('a', 'b', 'c', ' ', 'é');
  const str = (min: number, max: number) =>
    fc.array(alphabet, { minLength: min, maxLength: max }).map((a) => a.join(''));
  fc.assert(
    fc.property(
      fc.array(str(0, 6), { maxLength: 12 }),
      fc.array(str(1, 4), { maxLength: 3 }),
      fc.boolean(),
      (deltas, stops, includeStop) => {
        const want = reference(deltas, stops, includeStop);
        const got = run(deltas, stops, includeStop);
        assert.equal(got.text, want.text);
        assert.equal(got.stopped, want.stopped);
        for (const r of got.releases) assert.ok(want.text.startsWith(r), 'every release is a prefix of the answer');
      },
    ),
    { numRuns: 500 },
  );
});

test('a stop string completed by an earlier delta wins over a longer one that would only complete later', () => {
  assert.deepEqual(run(['ab', 'a'], ['aba', 'b']), { text: 'a', stopped: true, releases: ['a'] });
});

test('property: no piece of streamed text ends between the halves of a surrogate pair (an emoji stays whole)', () => {
  const piece = fc.constantFrom('a', 'z', ' ', '😀', 'é', '日', 'zz', '😀😀');
  fc.assert(
    fc.property(
      fc.array(fc.array(piece, { maxLength: 4 }), { maxLength: 12 }),
      fc.constantFrom('zz', 'xyz', '😀z'),
      (deltas, stop) => {
        const c = new StopChecker([stop]);
        const pieces = deltas.map((d) => c.push(d.join('')).text);
        pieces.push(c.flush());
        for (const p of pieces) {
          if (p.length === 0) continue;
          const last = p.charCodeAt(p.length - 1);
          const first = p.charCodeAt(0);
          assert.ok(!(last >= 0xd800 && last <= 0xdbff), `piece ${JSON.stringify(p)} ends with a lone high surrogate`);
          assert.ok(
            !(first >= 0xdc00 && first <= 0xdfff),
            `piece ${JSON.stringify(p)} starts with a lone low surrogate`,
          );
        }
      },
    ),
  );
});
