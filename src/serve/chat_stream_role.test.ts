/**
 * A streamed chat answer opens with the role alone, as vLLM (serving_chat.py: the first iteration sends
 * `DeltaMessage(role=role, content="")` with `logprobs=None`) and OpenAI do. The `openai` client's stream
 * helper (ChatCompletionStream) makes its snapshot choice from the first chunk, keeping that chunk's
 * logprobs object, and then appends the same chunk's logprobs to it again: when the first chunk carried
 * the first token and its logprob, every streamed chat with `logprobs: true` came back from
 * `finalChatCompletion()` with the first token's logprob twice (one more entry than tokens).
 */
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { encode } from '../model/tokenizer.ts';
import { startFake, sse, EOS, type Fake } from './scripted_server_testkit.ts';

let f: Fake;
before(async () => {
  f = await startFake();
  f.script = [...encode('Hello world'), EOS];
});
after(async () => f.close());

const body = { model: 'dsv4-mini', messages: [{ role: 'user' as const, content: 'hi' }], logprobs: true };

test('openai stream helper: streamed chat logprobs equal the non-streamed ones (one per token)', async () => {
  const client = new OpenAI({ baseURL: `${f.url}/v1`, apiKey: 'x', maxRetries: 0 });
  const whole = await client.chat.completions.create(body);
  const want = whole.choices[0]?.logprobs?.content?.map((c) => c.token);
  assert.deepEqual(want, ['Hello', ' world', '<|endoftext|>']);
  const final = await client.chat.completions.stream(body).finalChatCompletion();
  assert.deepEqual(
    final.choices[0]?.logprobs?.content?.map((c) => c.token),
    want,
  );
  assert.equal(final.choices[0]?.message.content, 'Hello world');
  assert.equal(final.choices[0]?.message.role, 'assistant');
});

test('the first chunk of a streamed chat is the role alone (no token, logprobs null), like vLLM', async () => {
  const chunks = (await sse(f.url, '/v1/chat/completions', { ...body, stream: true }))
    .filter((d) => d !== '[DONE]')
    .map((d) => JSON.parse(d));
  const first = chunks[0].choices[0];
  assert.deepEqual(first.delta, { role: 'assistant', content: '' });
  assert.equal(first.logprobs, null);
  assert.equal(first.finish_reason, null);
  // The role comes once; the tokens and their logprobs follow, each once.
  assert.equal(chunks.filter((c) => c.choices[0]?.delta?.role !== undefined).length, 1);
  const tokens = chunks.flatMap((c) => (c.choices[0]?.logprobs?.content ?? []).map((l: any) => l.token));
  assert.deepEqual(tokens, ['Hello', ' world', '<|endoftext|>']);
  assert.equal(chunks.map((c) => c.choices[0]?.delta?.content ?? '').join(''), 'Hello world');
});
