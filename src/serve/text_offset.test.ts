/**
 * Proves: completions' `logprobs.text_offset` counts characters as vLLM does (Python `len`: code points),
 * not UTF-16 units. GPT-2 token 32485 is " 🙂" whole: 2 characters for vLLM, 3 units for JavaScript, so
 * every offset after it was one too high (each astral character a token held added one more).
 */
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { decode, encode } from '../model/tokenizer.ts';
import { startFake, EOS, type Fake } from './scripted_server_testkit.ts';

const TEXT = 'I am 🙂 and 🙂 here';

let f: Fake;
before(async () => {
  f = await startFake();
  f.script = [...encode(TEXT), EOS];
});
after(async () => f.close());

test('completions text_offset: code points before each token, an astral character counting one', async () => {
  const ids = encode(TEXT);
  assert.ok(
    ids.some((id) => /\p{Extended_Pictographic}/u.test(decode([id]))),
    'a token must hold a whole emoji',
  );
  const want: number[] = [];
  let at = 0;
  for (const id of ids) {
    want.push(at);
    at += [...decode([id])].length;
  }
  const r = await fetch(`${f.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'x', max_tokens: 40, logprobs: 0 }),
  });
  const json = (await r.json()) as { choices: Array<{ text: string; logprobs: { text_offset: number[] } }> };
  assert.equal(json.choices[0]?.text, TEXT);
  assert.deepEqual(json.choices[0]?.logprobs.text_offset.slice(0, ids.length), want);
});
