/**
 * kv-aware routing over real instances in process (threaded devices, tcp transfer on loopback): 1
 * prefill, 2 decodes and a colocated reference. The proxy's index follows the instances' KV events;
 * a first request goes prefill → decode; a second one that extends its prompt goes to the decode that
 * holds the prefix, without a remote prefill (decode computes the rest like a colocated instance); both
 * answer exactly what the colocated instance answers. A decode dead under the proxy costs a retry, not
 * the request (and prefill's held pages come back by another decode's release). A draining instance
 * answers 503 to health and new requests while its request in flight finishes.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance, type InstanceOptions } from './instance.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(13);
let colocated: Instance;
let p: Instance;
let d0: Instance;
let d1: Instance;
let proxy: Proxy;
let url: string;

function opts(role: InstanceOptions['role']): InstanceOptions {
  return { ...DEFAULT_INSTANCE_OPTIONS, role, port: 0, numBlocks: 128, scheduler: { maxModelLen: 512 } };
}

before(async () => {
  [colocated, p, d0, d1] = await Promise.all([
    startInstance(opts('both'), env),
    startInstance(opts('prefill'), env),
    startInstance(opts('decode'), env),
    startInstance(opts('decode'), env),
  ]);
  proxy = new Proxy(
    {
      ...DEFAULT_PROXY_OPTIONS,
      prefillUrls: [p.url],
      decodeUrls: [d0.url, d1.url],
      policy: 'kv-aware',
      router: { kvWeight: 4, skipPrefillMaxTokens: 64 },
      healthIntervalMs: 200,
    },
    env,
  );
  url = `http://127.0.0.1:${await proxy.listen(0, '127.0.0.1')}`;
  await proxy.start();
});

after(async () => {
  await proxy.close();
  await Promise.all([colocated, p, d0, d1].map((i) => i.close()));
});

async function tokensOf(base: string, prompt: number[]): Promise<number[]> {
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 6, temperature: 0, return_token_ids: true }),
    signal: AbortSignal.timeout(60_000),
  });
  const j = (await r.json()) as { choices?: Array<{ token_ids: number[] }> };
  assert.equal(r.status, 200, JSON.stringify(j));
  return j.choices?.[0]?.token_ids ?? assert.fail('token_ids');
}

async function routes(): Promise<Record<string, number>> {
  const text = (await proxy.metrics.text()).body;
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^handoff_proxy_routes_total\{path="([^"]+)"\} (\S+)$/gm)) out[m[1]!] = Number(m[2]);
  return out;
}

async function until(what: string, cond: () => boolean): Promise<void> {
  const deadline = env.nowMs() + 20_000;
  while (!cond()) {
    if (env.nowMs() > deadline) assert.fail(`${what}: not true after 20 s`);
    await env.sleep(20);
  }
}

test('kv-aware: the decode holding the prefix serves the extension without a remote prefill; outputs equal colocated', async () => {
  const a = Array.from({ length: 160 }, (_, i) => 1000 + i);
  const b = [...a, ...Array.from({ length: 30 }, (_, i) => 3000 + i)];
  assert.deepEqual(await tokensOf(url, a), await tokensOf(colocated.url, a), 'P/D route equals colocated');
  assert.deepEqual(await routes(), { pd: 1 });
  const holder = [d0, d1].find((d) => proxy.decode.members.find((m) => m.url === d.url)!.served === 1)!;
  await until('the index learned what the decode cached', () => proxy.index.hashesOf(holder.url).size > 0);
  assert.deepEqual(await tokensOf(url, b), await tokensOf(colocated.url, b), 'decode-only route equals colocated');
  assert.deepEqual(await routes(), { pd: 1, 'decode-only': 1 });
  assert.equal(proxy.decode.members.find((m) => m.url === holder.url)!.served, 2, 'the same decode, twice');
  assert.equal(proxy.prefill.members[0]!.served, 1, 'prefill was asked once');
  assert.ok(proxy.router.stats.skippedPrefill >= 1);
});

test('a decode that died after its last health check: the request is retried once on another decode', async () => {
  const doomed = await startInstance(opts('decode'), env);
  const rr = new Proxy(
    {
      ...DEFAULT_PROXY_OPTIONS,
      prefillUrls: [p.url],
      decodeUrls: [doomed.url, d0.url],
      healthIntervalMs: 600_000, // no health check will notice: only the failed request does
    },
    env,
  );
  const rrUrl = `http://127.0.0.1:${await rr.listen(0, '127.0.0.1')}`;
  try {
    await rr.start();
    assert.equal(rr.decode.numHealthy, 2);
    await doomed.close();
    const t = Array.from({ length: 40 }, (_, i) => 500 + i);
    const want = await tokensOf(colocated.url, t);
    for (let i = 0; i < 2; i++) assert.deepEqual(await tokensOf(rrUrl, t), want, `request ${i} answered`);
    assert.match((await rr.metrics.text()).body, /^handoff_proxy_retries_total 1$/m);
    assert.equal(rr.decode.members[0]!.healthy, false, 'the dead decode is marked down');
    // Prefill's pages held for the dead decode come back through the other decode's release, not the lease.
    await until('prefill pages back', () => p.engine.scheduler.numHeldForSend === 0);
  } finally {
    await rr.close();
  }
});

test('drain: health and new requests answer 503 at once, the request in flight finishes, then the instance closes', async () => {
  const inst = await startInstance(opts('both'), env);
  const body = (n: number) => ({ prompt: [1, 2, 3, 4], max_tokens: n, temperature: 0, ignore_eos: true });
  const post = (b: unknown) =>
    fetch(`${inst.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(b),
    });
  const inFlight = post(body(48));
  await until('the request runs', () => inst.engine.scheduler.numRunning > 0);
  const drained = inst.drainAndClose(30_000);
  const health = await fetch(`${inst.url}/health`);
  assert.equal(health.status, 503);
  assert.match(JSON.stringify(await health.json()), /draining/);
  const refused = await post(body(2));
  assert.equal(refused.status, 503);
  assert.equal(((await refused.json()) as { error: { code: string } }).error.code, 'OVERLOADED');
  const r = await inFlight;
  assert.equal(r.status, 200);
  assert.equal(((await r.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens, 48);
  assert.equal(await drained, true, 'drained before the bound');
  await assert.rejects(fetch(`${inst.url}/health`), 'closed after draining');
});
