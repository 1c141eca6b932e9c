/**
 * A chat message's `tool_calls` (and the legacy `function_call`) are part of the conversation in vLLM: its
 * chat template renders them into the prompt. This server's fixed template renders content only, and it
 * refuses `tools` / `functions` as unsupported, yet an assistant message carrying tool calls was taken
 * with a 200 and its calls silently dropped: the model answered another conversation than the one sent.
 * Such a message must be a clear 400 naming the field; an empty list or null (nothing to render) stays fine.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { encode } from '../model/tokenizer.ts';
import { startFake, EOS, type Fake } from './scripted_server_testkit.ts';

let f: Fake;
before(async () => {
  f = await startFake();
  f.script = [...encode('ok'), EOS];
});
after(async () => f.close());

async function chat(messages: unknown[]): Promise<{ status: number; json: any }> {
  const r = await fetch(`${f.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages }),
  });
  return { status: r.status, json: await r.json() };
}

const call = { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } };

test('a message with tool_calls is a 400 naming it, not answered with the calls dropped', async () => {
  const r = await chat([
    { role: 'user', content: 'weather in Paris?' },
    { role: 'assistant', content: '', tool_calls: [call] },
    { role: 'tool', content: '21C', tool_call_id: 'call_1' },
  ]);
  assert.equal(r.status, 400, JSON.stringify(r.json));
  assert.equal(r.json.error.code, 'BAD_REQUEST');
  assert.equal(r.json.error.param, 'messages[1].tool_calls');
});

test('a message with the legacy function_call is refused too', async () => {
  const r = await chat([
    { role: 'user', content: 'hi' },
    { role: 'assistant', content: '', function_call: { name: 'f', arguments: '{}' } },
  ]);
  assert.equal(r.status, 400, JSON.stringify(r.json));
  assert.equal(r.json.error.param, 'messages[1].function_call');
});

test('tool_calls [] or null and function_call null render nothing: still accepted', async () => {
  const r = await chat([
    { role: 'user', content: 'hi' },
    { role: 'assistant', content: 'hello', tool_calls: [], function_call: null },
    { role: 'user', content: 'again', tool_calls: null },
  ]);
  assert.equal(r.status, 200, JSON.stringify(r.json));
  assert.equal(r.json.choices[0].message.content, 'ok');
});
