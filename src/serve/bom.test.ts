/**
 * Proves that a generated U+FEFF (ZERO WIDTH NO-BREAK SPACE, GPT-2 tokens 171 119 123) reaches the
 * client: the tokenizer's TextDecoder dropped a leading BOM from every decode, so the incremental
 * detokenizer, which decodes each token (or held-back run) on its own, deleted every U+FEFF that began a
 * token (or run), streamed and not. vLLM (HF tokenizers) returns the character.
 */
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { decode, encode, IncrementalDecoder } from '../model/tokenizer.ts';
import { startFake, sse, EOS, type Fake } from './scripted_server_testkit.ts';

const TEXT = 'a\ufeffb \ufeffc';

let f: Fake;
before(async () => {
  f = await startFake();
  f.script = [...encode(TEXT), EOS];
});
after(async () => f.close());

test('decode keeps a leading U+FEFF; the incremental decoder streams exactly the full text', () => {
  assert.equal(decode(encode('\ufeffhello')), '\ufeffhello');
  const d = new IncrementalDecoder();
  const streamed =
    encode(TEXT)
      .map((id) => d.push(id))
      .join('') + d.flush();
  assert.equal(streamed, TEXT);
});

test('completions: U+FEFF in the answer is returned, streamed and not', async () => {
  const body = { prompt: 'x', max_tokens: 20 };
  const r = await fetch(`${f.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const json = (await r.json()) as any;
  assert.equal(json.choices[0].text, TEXT);
  const chunks = (await sse(f.url, '/v1/completions', { ...body, stream: true }))
    .filter((d) => d !== '[DONE]')
    .map((d) => JSON.parse(d));
  assert.equal(chunks.map((c) => c.choices[0].text).join(''), TEXT);
});

test('chat: U+FEFF in the answer is returned', async () => {
  const r = await fetch(`${f.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'x' }], max_tokens: 20 }),
  });
  const json = (await r.json()) as any;
  assert.equal(json.choices[0].message.content, TEXT);
});
