/**
 * llm-d's routing-sidecar protocol, spoken to a handoff decode instance as an llm-d router would (no
 * proxy): the request names its prefiller in `x-prefiller-host-port`; decode prefills there (max_tokens
 * 1, do_remote_decode) and decodes with the returned kv_transfer_params. Proves the answer equals a
 * colocated instance's (JSON, SSE and chat), that the KV really moved (prefill answered, decode READ
 * bytes), and the edge: a malformed header is a 400, a prefiller outside --kv-peers a 403 with nothing
 * contacted, an unreachable one a 502, the header on a prefill instance or with kv_transfer_params a 400.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance, type InstanceOptions } from './instance.ts';
import { SseParser } from './sse.ts';

const env = new RealEnv(23);
let colocated: Instance;
let p: Instance;
let d: Instance;
let dStrict: Instance;

function opts(role: InstanceOptions['role'], extra: Partial<InstanceOptions> = {}): InstanceOptions {
  return { ...DEFAULT_INSTANCE_OPTIONS, role, port: 0, numBlocks: 96, scheduler: { maxModelLen: 512 }, ...extra };
}

before(async () => {
  [colocated, p, d, dStrict] = await Promise.all([
    startInstance(opts('both'), env),
    startInstance(opts('prefill'), env),
    startInstance(opts('decode'), env),
    startInstance(opts('decode', { kvPeers: ['10.9.9.9:*'] }), env),
  ]);
});

after(async () => {
  await Promise.all([colocated, p, d, dStrict].map((i) => i.close()));
});

const hostPort = (i: Instance): string => new URL(i.url).host;

async function call(
  target: Instance,
  body: Record<string, unknown>,
  prefiller: string | null,
  path = '/v1/completions',
): Promise<{ status: number; text: string }> {
  const r = await fetch(`${target.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(prefiller ? { 'x-prefiller-host-port': prefiller } : {}) },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(60_000),
  });
  return { status: r.status, text: await r.text() };
}

async function metric(i: Instance, name: string): Promise<number> {
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'm').exec((await i.server.metrics.text()).body);
  return Number(m?.[1] ?? 0);
}

const prompt = Array.from({ length: 70 }, (_, i) => 200 + i);
const base = { prompt, max_tokens: 8, temperature: 0, return_token_ids: true };
const ids = (text: string): number[] =>
  (JSON.parse(text) as { choices: Array<{ token_ids: number[] }> }).choices[0]!.token_ids;

test('llm-d protocol: decode prefills on the named prefiller, reads its KV, answers like colocated (JSON, SSE, chat)', async () => {
  const want = ids((await call(colocated, base, null)).text);
  const prefillsBefore = await metric(p, 'handoff_prompt_tokens_total');
  const got = await call(d, base, hostPort(p));
  assert.equal(got.status, 200, got.text);
  assert.deepEqual(ids(got.text), want);
  assert.equal(await metric(p, 'handoff_prompt_tokens_total'), prefillsBefore + prompt.length, 'prefill computed it');
  assert.ok((await metric(d, 'handoff_transfer_bytes_read_total')) > 0, 'decode READ the KV');
  const sse = await call(d, { ...base, stream: true }, hostPort(p));
  assert.equal(sse.status, 200);
  const streamed = new SseParser()
    .push(sse.text)
    .filter((x) => x !== '[DONE]')
    .flatMap((x) => (JSON.parse(x) as { choices: Array<{ token_ids?: number[] }> }).choices[0]?.token_ids ?? []);
  assert.deepEqual(streamed, want, 'streamed tokens equal');
  const chat = { messages: [{ role: 'user', content: 'Move the cache.' }], max_tokens: 6, temperature: 0 };
  const c1 = await call(colocated, chat, null, '/v1/chat/completions');
  const c2 = await call(d, chat, hostPort(p), '/v1/chat/completions');
  assert.equal(c2.status, 200, c2.text);
  const content = (t: string) => (JSON.parse(t) as { choices: Array<{ message: { content: string } }> }).choices[0];
  assert.equal(content(c2.text)?.message.content, content(c1.text)?.message.content);
});

test('llm-d protocol edge: bad header 400, disallowed prefiller 403 (nothing contacted), unreachable 502, misuse 400', async () => {
  const code = (t: string) => (JSON.parse(t) as { error: { code: string; param: string } }).error;
  for (const h of ['nonsense', 'a:1,b:2', '127.0.0.1:0', '127.0.0.1:99999', 'host name:80']) {
    const r = await call(d, base, h);
    assert.equal(r.status, 400, h);
    assert.equal(code(r.text).param, 'x-prefiller-host-port');
  }
  const before = await metric(p, 'handoff_prompt_tokens_total');
  const denied = await call(dStrict, base, hostPort(p));
  assert.equal(denied.status, 403);
  assert.equal(code(denied.text).code, 'PEER_NOT_ALLOWED');
  assert.equal(await metric(p, 'handoff_prompt_tokens_total'), before, 'the prefiller was never asked');
  const gone = await call(d, base, '127.0.0.1:9');
  assert.equal(gone.status, 502);
  assert.equal(code(gone.text).code, 'PEER_UNAVAILABLE');
  assert.equal((await call(p, base, hostPort(p))).status, 400, 'a prefill instance does not take the header');
  const both = await call(d, { ...base, kv_transfer_params: { do_remote_prefill: true } }, hostPort(p));
  assert.equal(both.status, 400);
  assert.equal((await call(d, base, hostPort(p))).status, 200, 'decode still serves');
});
