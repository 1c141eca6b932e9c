/**
 * A stop string completed only by the text the detokenizer releases at the very end (the last tokens held
 * part of a character: their text ends in U+FFFD and waited for a continuation that never came) ends the
 * answer like any stop string: the text is cut before it AND the choice says so (finish_reason 'stop',
 * stop_reason the string). The final flush's match was ignored: the text was cut at the stop string while
 * finish_reason stayed 'length' (or 'stop' with stop_reason null after EOS), streamed and not.
 */
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { encode, decode } from '../model/tokenizer.ts';
import { startFake, sse, EOS, type Fake } from './scripted_server_testkit.ts';

/** GPT-2 token 564: a space and the first two bytes of a three-byte character (" \xe2\x80"). */
const SPACE_PARTIAL = 564;

let f: Fake;
before(async () => {
  f = await startFake();
});
after(async () => f.close());

async function post(body: unknown): Promise<any> {
  const r = await fetch(`${f.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  assert.equal(r.status, 200);
  return r.json();
}

test('a stop string in the detokenizer’s final flush: text cut, finish_reason stop, stop_reason the string', async () => {
  assert.equal(decode([SPACE_PARTIAL]), ' \uFFFD');
  const cases: Array<[number[], number]> = [
    [[...encode('Hello'), SPACE_PARTIAL], 2], // ends by length on the partial token
    [[...encode('Hello'), SPACE_PARTIAL, EOS], 5], // ends by EOS after it
  ];
  for (const [script, maxTokens] of cases) {
    f.script = script;
    const body = { prompt: 'x', max_tokens: maxTokens, stop: ['o '] };
    const j = await post(body);
    const c = j.choices[0];
    assert.equal(c.text, 'Hell');
    assert.equal(c.finish_reason, 'stop', JSON.stringify(c));
    assert.equal(c.stop_reason, 'o ');
    const last = (await sse(f.url, '/v1/completions', { ...body, stream: true }))
      .filter((d) => d !== '[DONE]')
      .map((d) => JSON.parse(d))
      .at(-1);
    assert.equal(last.choices[0].finish_reason, 'stop');
    assert.equal(last.choices[0].stop_reason, 'o ');
  }
});
