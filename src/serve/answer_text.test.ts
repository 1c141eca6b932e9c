/**
 * Text of an answer over scripted tokens (scripted_server_testkit.ts): with ignore_eos the EOS token is
 * generated like any other, and its text ("<|endoftext|>") is never returned (vLLM's skip_special_tokens;
 * it was, streamed and not); with a stop string set, streamed text never splits an emoji's surrogate pair
 * across chunks (each chunk is valid text).
 */
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { encode } from '../model/tokenizer.ts';
import { startFake, EOS, type Fake } from './scripted_server_testkit.ts';

let f: Fake;
before(async () => {
  f = await startFake();
  f.script = [...encode('Hi'), EOS, ...encode(' there')]; // "Hi" EOS " there"
});
after(async () => f.close());

const body = { model: 'dsv4-mini', prompt: 'x', max_tokens: 3, ignore_eos: true, skip_special_tokens: true } as const;

test('ignore_eos: the EOS token text is not in a non-streamed completion', async () => {
  const c = new OpenAI({ baseURL: `${f.url}/v1`, apiKey: 'x' });
  const r = await c.completions.create(body as never);
  assert.equal(r.usage?.completion_tokens, 3);
  assert.equal((r as any).choices[0].text, 'Hi there');
});

test('ignore_eos: the EOS token text is not in a streamed chat answer', async () => {
  const c = new OpenAI({ baseURL: `${f.url}/v1`, apiKey: 'x' });
  let text = '';
  const stream = await c.chat.completions.create({
    model: 'dsv4-mini',
    messages: [{ role: 'user', content: 'x' }],
    max_tokens: 3,
    stream: true,
    ignore_eos: true,
  } as never);
  for await (const ch of stream as any) text += ch.choices[0]?.delta?.content ?? '';
  assert.equal(text, 'Hi there');
});

test('stop strings set: streamed chat deltas never split an emoji (each delta is valid text)', async () => {
  f.script = [...encode('Hi 😀 there'), EOS];
  const c = new OpenAI({ baseURL: `${f.url}/v1`, apiKey: 'x' });
  const body = { model: 'dsv4-mini', messages: [{ role: 'user' as const, content: 'hi' }], stop: ['zz'] };
  const deltas: string[] = [];
  for await (const ch of await c.chat.completions.create({ ...body, stream: true }))
    deltas.push(ch.choices[0]?.delta?.content ?? '');
  const lone = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;
  for (const d of deltas) assert.ok(!lone.test(d), `delta ${JSON.stringify(d)} holds a lone surrogate`);
  assert.equal(deltas.join(''), 'Hi 😀 there');
});
