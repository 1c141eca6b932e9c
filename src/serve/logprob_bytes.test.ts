/**
 * Proves that chat logprobs give each token's own UTF-8 bytes (OpenAI: `bytes` is there for "characters
 * represented by multiple tokens": their bytes combined give the text). A token holding part of a
 * character (an emoji is split over GPT-2 tokens) had the bytes of U+FFFD (239 191 189) instead, so the
 * combined bytes were not the answer, streamed or not.
 */
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { decode, encode } from '../model/tokenizer.ts';
import { startFake, sse, EOS, type Fake } from './scripted_server_testkit.ts';

const TEXT = 'Hi 😀 café';

let f: Fake;
before(async () => {
  f = await startFake();
  f.script = [...encode(TEXT), EOS];
});
after(async () => f.close());

const body = { messages: [{ role: 'user', content: 'x' }], max_tokens: 20, logprobs: true };

/** The answer's bytes as the logprobs give them (EOS's entry, the last, left out), decoded. */
function textOfBytes(content: Array<{ bytes: number[] }>): string {
  return Buffer.from(content.slice(0, -1).flatMap((c) => c.bytes)).toString('utf8');
}

test('chat logprobs: the tokens’ bytes combine into the answer (a split emoji included)', async () => {
  assert.ok(
    encode(TEXT).some((id) => decode([id]).includes('\uFFFD')),
    'the answer must split a character over tokens',
  );
  const r = await fetch(`${f.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const json = (await r.json()) as any;
  assert.equal(json.choices[0].message.content, TEXT);
  assert.equal(textOfBytes(json.choices[0].logprobs.content), TEXT);
});

test('chat logprobs streamed: the same bytes', async () => {
  const chunks = (await sse(f.url, '/v1/chat/completions', { ...body, stream: true }))
    .filter((d) => d !== '[DONE]')
    .map((d) => JSON.parse(d));
  const content = chunks.flatMap((c) => c.choices[0]?.logprobs?.content ?? []);
  assert.equal(textOfBytes(content), TEXT);
});
