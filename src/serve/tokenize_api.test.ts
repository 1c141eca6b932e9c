/**
 * Proves vLLM's /tokenize, /detokenize and /version on an instance and through the proxy: a prompt's
 * ids are the tokenizer's (chat messages through the chat template, with or without the generation
 * prompt), /detokenize inverts them, bad bodies get a 400 naming the field (never a crash), another
 * model is a 404, the API key guards the tokenizer endpoints, and the proxy answers them as a decode
 * instance does (its status and error included).
 */
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { encode } from '../model/tokenizer.ts';
import { RealEnv } from '../util/env.ts';
import { applyChatTemplate, ASSISTANT_TURN } from './chat_template.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance } from './instance.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';
import { startFake, type Fake } from './scripted_server_testkit.ts';

const env = new RealEnv(5);
let f: Fake;
let keyed: Fake;
let pd: Instance[];
let proxy: Proxy;
let proxyUrl: string;
before(async () => {
  [f, keyed] = await Promise.all([startFake({ maxModelLen: 64 }), startFake({ apiKey: 'k', maxModelLen: 64 })]);
  const o = { ...DEFAULT_INSTANCE_OPTIONS, port: 0, numBlocks: 32, scheduler: { maxModelLen: 64 } };
  const kv = JSON.stringify({ kv_connector_extra_config: {} });
  pd = await Promise.all([
    startInstance({ ...o, role: 'prefill', kvTransferConfig: kv }, env),
    startInstance({ ...o, role: 'decode', kvTransferConfig: kv }, env),
  ]);
  const [p, d] = pd as [Instance, Instance];
  proxy = new Proxy({ ...DEFAULT_PROXY_OPTIONS, healthTimeoutMs: 500, prefillUrls: [p.url], decodeUrls: [d.url] }, env);
  proxyUrl = `http://127.0.0.1:${await proxy.listen(0, '127.0.0.1')}`;
  await proxy.start();
});
after(async () => {
  await proxy.close();
  await Promise.all([f.close(), keyed.close(), ...pd.map((i) => i.close())]);
});

async function post(url: string, path: string, body: unknown, headers: Record<string, string> = {}) {
  const r = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: r.status, json: (await r.json()) as any };
}

for (const where of ['instance', 'proxy'] as const) {
  const url = (): string => (where === 'instance' ? f.url : proxyUrl);

  test(`${where}: /tokenize counts a prompt's ids and /detokenize gives the text back`, async () => {
    const text = 'Hello, world! ünïcode 🙂';
    const t = await post(url(), '/tokenize', { prompt: text, return_token_strs: true });
    assert.equal(t.status, 200);
    assert.deepEqual(t.json.tokens, encode(text));
    assert.equal(t.json.count, encode(text).length);
    assert.equal(t.json.max_model_len, 64);
    assert.equal(t.json.token_strs.length, t.json.count);
    assert.equal(t.json.token_strs[0], 'Hello');
    const d = await post(url(), '/detokenize', { tokens: t.json.tokens });
    assert.deepEqual(d, { status: 200, json: { prompt: text } });
    const plain = await post(url(), '/tokenize', { prompt: text });
    assert.equal(plain.json.token_strs, null);
  });

  test(`${where}: /tokenize of chat messages goes through the chat template`, async () => {
    const messages = [{ role: 'user', content: 'Hi there' }];
    const withPrompt = await post(url(), '/tokenize', { messages });
    assert.deepEqual(withPrompt.json.tokens, encode(applyChatTemplate(messages)));
    const without = await post(url(), '/tokenize', { messages, add_generation_prompt: false });
    const templated = applyChatTemplate(messages);
    assert.deepEqual(without.json.tokens, encode(templated.slice(0, -ASSISTANT_TURN.length)));
  });

  test(`${where}: bad bodies get a 400 naming the field, another model a 404`, async () => {
    const cases: Array<[unknown, string | null]> = [
      [{}, 'prompt'],
      [{ prompt: 'a', messages: [{ role: 'user', content: 'b' }] }, 'messages'],
      [{ prompt: [1, 2] }, 'prompt'],
      [{ prompt: 'a', return_token_strs: 'yes' }, 'return_token_strs'],
      [{ messages: 'hi' }, 'messages'],
      ['[1,2]', null],
    ];
    for (const [body, param] of cases) {
      const r = await post(url(), '/tokenize', body);
      assert.equal(r.status, 400, JSON.stringify(body));
      assert.equal(r.json.error.param ?? null, param, JSON.stringify(r.json));
    }
    for (const tokens of [[-1], [50257], [1.5], ['a'], 'abc', Array.from({ length: 65 }, () => 1), null]) {
      const r = await post(url(), '/detokenize', { tokens });
      assert.equal(r.status, 400, JSON.stringify(tokens).slice(0, 40));
      assert.match(r.json.error.param, /^tokens/);
    }
    const other = await post(url(), '/tokenize', { prompt: 'a', model: 'not-served' });
    assert.equal(other.status, 404);
    const huge = await post(url(), '/detokenize', { tokens: Array.from({ length: 200_000 }, () => 1) });
    assert.equal(huge.status, 400);
    assert.match(huge.json.error.message, /at most 64 tokens/);
  });

  test(`${where}: GET /version`, async () => {
    const r = await fetch(`${url()}/version`);
    assert.equal(r.status, 200);
    assert.match(((await r.json()) as { version: string }).version, /^\d+\.\d+\.\d+/);
  });
}

test('the API key guards /tokenize and /detokenize, not /version', async () => {
  assert.equal((await post(keyed.url, '/tokenize', { prompt: 'a' })).status, 401);
  assert.equal((await post(keyed.url, '/detokenize', { tokens: [1] })).status, 401);
  const ok = await post(keyed.url, '/tokenize', { prompt: 'a' }, { authorization: 'Bearer k' });
  assert.equal(ok.status, 200);
  assert.equal((await fetch(`${keyed.url}/version`)).status, 200);
});

test('proxy: an error of /tokenize or /detokenize is the decode instance’s, word for word (no "decode: " prefix)', async () => {
  // The proxy answers these as the instance does: a client of a vLLM router sees the server's error, not
  // one naming the proxy's internal leg (before session 14 the message read "decode: prompt ...").
  const d = (pd as [Instance, Instance])[1];
  for (const [path, body] of [
    ['/tokenize', {}],
    ['/tokenize', { prompt: 'a', model: 'not-served' }],
    ['/detokenize', { tokens: [-1] }],
  ] as const) {
    const [direct, proxied] = await Promise.all([post(d.url, path, body), post(proxyUrl, path, body)]);
    assert.equal(proxied.status, direct.status, path);
    assert.deepEqual(proxied.json, direct.json, `${path} ${JSON.stringify(body)}`);
  }
});
