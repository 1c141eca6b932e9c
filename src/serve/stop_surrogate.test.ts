/**
 * A stop string holding half of a surrogate pair (JSON "\ud83d", which JSON.parse accepts) never matches
 * half of a character in the answer: generated text is whole characters, and vLLM (Python str, one code
 * point per emoji) never finds a lone surrogate in it, so the answer runs on.
 *
 * Failed before: String.indexOf matched the emoji's first UTF-16 half, so "Hi 😀 there" with stop
 * ["\ud83d"] stopped at "Hi " (stop_reason "\ud83d"), and with include_stop_str_in_output the answer
 * ended in a lone high surrogate: text the client cannot decode (half an emoji).
 */
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { encode } from '../model/tokenizer.ts';
import { StopChecker } from './stop_checker.ts';
import { startFake, type Fake } from './scripted_server_testkit.ts';

let f: Fake;
before(async () => {
  f = await startFake();
});
after(async () => f.close());

function run(deltas: string[], stops: string[], include = false): { text: string; matched: string | null } {
  const c = new StopChecker(stops, include);
  let text = '';
  for (const d of deltas) {
    const r = c.push(d);
    text += r.text;
    if (r.stopped) return { text, matched: c.matched };
  }
  return { text: text + c.flush(), matched: null };
}

test('StopChecker: a lone surrogate never matches half of a surrogate pair', () => {
  for (const include of [false, true]) {
    assert.deepEqual(run(['Hi 😀 there'], ['\ud83d'], include), { text: 'Hi 😀 there', matched: null });
    assert.deepEqual(run(['Hi ', '😀', ' there'], ['\ude00 t'], include), { text: 'Hi 😀 there', matched: null });
    assert.deepEqual(run(['Hi 😀 there'], ['i \ud83d'], include), { text: 'Hi 😀 there', matched: null });
  }
  // A whole character still matches, also after a half that did not.
  assert.deepEqual(run(['a😀b😀c'], ['\ude00', '😀c']), { text: 'a😀b', matched: '😀c' });
});

test('HTTP: stop ["\\ud83d"] does not cut an emoji in two', async () => {
  f.script = encode('Hi 😀 there');
  for (const include of [false, true]) {
    const r = await fetch(`${f.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: `{"prompt":"x","max_tokens":${f.script.length},"stop":["\\ud83d"],"include_stop_str_in_output":${include}}`,
    });
    assert.equal(r.status, 200);
    const c = ((await r.json()) as any).choices[0];
    assert.deepEqual([c.text, c.finish_reason, c.stop_reason], ['Hi 😀 there', 'length', null], `include ${include}`);
  }
});
