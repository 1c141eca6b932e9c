/**
 * When one token's text completes two stop strings at once, vLLM takes the first one in the request's
 * `stop` list that is found (vllm/v1/engine/detokenizer.py check_stop_strings iterates `stop` in order
 * and returns the first match), not the one that starts earliest in the text: both the text and
 * `stop_reason` follow the list order, with and without include_stop_str_in_output, streamed or not.
 *
 * Failed before: the checker cut at the earliest-starting stop string whatever the list order, so for
 * GPT-2's " the" and stop ["e", "th"] the answer was " " with stop_reason "th" where vLLM answers " th"
 * with stop_reason "e" (and " th"/"th" instead of " the"/"e" with include_stop_str_in_output).
 */
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { encode } from '../model/tokenizer.ts';
import { StopChecker } from './stop_checker.ts';
import { startFake, sse, type Fake } from './scripted_server_testkit.ts';

let f: Fake;
before(async () => {
  f = await startFake();
});
after(async () => f.close());

test('StopChecker: two stop strings in one delta: the first listed wins (vLLM), not the earliest in the text', () => {
  const c = new StopChecker(['e', 'th']);
  assert.deepEqual(c.push(' the'), { text: ' th', stopped: true });
  assert.equal(c.matched, 'e');
  const inc = new StopChecker(['e', 'th'], true);
  assert.deepEqual(inc.push(' the'), { text: ' the', stopped: true });
  assert.equal(inc.matched, 'e');
  const other = new StopChecker(['th', 'e']);
  assert.deepEqual(other.push(' the'), { text: ' ', stopped: true });
  assert.equal(other.matched, 'th');
});

test('HTTP: the answer and stop_reason follow the stop list order, streamed and not', async () => {
  const script = encode(' the end');
  assert.equal(script.length, 2, '" the" is one GPT-2 token');
  f.script = script;
  for (const [include, text] of [
    [false, ' th'],
    [true, ' the'],
  ] as const) {
    const body = { prompt: 'x', max_tokens: 2, stop: ['e', 'th'], include_stop_str_in_output: include };
    const r = await fetch(`${f.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    const c = ((await r.json()) as any).choices[0];
    assert.deepEqual([c.text, c.finish_reason, c.stop_reason], [text, 'stop', 'e'], `include ${include}`);
    const chunks = (await sse(f.url, '/v1/completions', { ...body, stream: true }))
      .filter((d) => d !== '[DONE]')
      .map((d) => JSON.parse(d).choices[0]);
    assert.equal(chunks.map((ch) => ch.text).join(''), text, `streamed, include ${include}`);
    assert.equal(chunks.at(-1).stop_reason, 'e');
  }
});
