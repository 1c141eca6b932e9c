/**
 * A prompt (completion prompt, chat message content, /tokenize) holding a JSON escape of a lone UTF-16
 * surrogate (`"\ud800"`) is refused (400 naming the field): it is not text. Before, JSON.parse kept the
 * lone surrogate and the tokenizer's UTF-8 encoding turned it into U+FFFD, so `"a\ud800b"` was silently
 * computed as the prompt `"a\ufffdb"` (same token ids, 200): the very change readJsonBody's strict UTF-8
 * check exists to prevent for raw bytes. (A lone surrogate in a stop string stays accepted: it only
 * never matches, stop_surrogate.test.ts.)
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { smallInstances } from './small_instances_testkit.ts';

const start = smallInstances(new RealEnv(7));

async function post(url: string, path: string, body: string): Promise<{ status: number; json: any }> {
  const r = await fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  return { status: r.status, json: JSON.parse(await r.text()) };
}

test('a lone surrogate escape in a prompt is refused, not computed as U+FFFD', async () => {
  const inst = await start({ device: 'sim' });
  const lone = await post(inst.url, '/tokenize', '{"prompt":"a\\ud800b"}');
  assert.equal(lone.status, 400, `tokenize: ${JSON.stringify(lone.json)}`);
  assert.equal(lone.json.error.code, 'BAD_REQUEST');
  assert.equal(lone.json.error.param, 'prompt');
  const completion = await post(inst.url, '/v1/completions', '{"prompt":["a\\udc00b"],"max_tokens":1}');
  assert.equal(completion.status, 400, `completion: ${JSON.stringify(completion.json)}`);
  assert.equal(completion.json.error.param, 'prompt[0]');
  const messages = '[{"role":"user","content":"hi"},{"role":"user","content":[{"type":"text","text":"\\ud83d"}]}]';
  const chat = await post(inst.url, '/v1/chat/completions', `{"messages":${messages}}`);
  assert.equal(chat.status, 400, `chat: ${JSON.stringify(chat.json)}`);
  assert.equal(chat.json.error.param, 'messages[1].content');
  // A pair (an emoji), U+FFFD itself, and an escaped backslash before "ud800" are text: still served.
  for (const prompt of ['"\\ud83d\\ude00"', '"a\\ufffdb"', '"a\\\\ud800b"']) {
    const ok = await post(inst.url, '/tokenize', `{"prompt":${prompt}}`);
    assert.equal(ok.status, 200, `${prompt}: ${JSON.stringify(ok.json)}`);
  }
});
