/**
 * The proxy's view of P/D compatibility. Instances publish in /handoff/info what must match for a
 * prefill and a decode to pair (compat_hash: the handshake's compatibility hash over model, preset,
 * weight seed and cache layout). A prefill whose weights differ (--seed) from every decode is kept out
 * of routing, with the reason in the proxy's view, while a compatible one keeps serving: before, both
 * were 'healthy' and every request routed to the odd one failed 400 BAD_TRANSFER_PARAMS
 * (param kv_transfer_params.remote_host), blaming the client for the operator's mismatch.
 * When no pair can be formed at all, the proxy's /health is 503 and a completion is a 503, not a 400.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { smallInstances } from './small_instances_testkit.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';
import type { InstanceInfo } from './instance_server.ts';
import { unpairedReason } from './pool_pairing.ts';

const env = new RealEnv(43);
const start = smallInstances(env);

const body = JSON.stringify({ prompt: 'the quick brown fox jumps over the lazy dog', max_tokens: 4, temperature: 0 });

async function post(url: string): Promise<{ status: number; json: any }> {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body,
    signal: AbortSignal.timeout(20_000),
  });
  return { status: r.status, json: await r.json() };
}

test('a prefill with other weights than every decode is kept out of routing; the compatible one serves', async () => {
  const decode = await start({ role: 'decode', modelSeed: 1 });
  const odd = await start({ role: 'prefill', modelSeed: 2 });
  const good = await start({ role: 'prefill', modelSeed: 1 });
  const proxy = new Proxy(
    { ...DEFAULT_PROXY_OPTIONS, prefillUrls: [odd.url, good.url], decodeUrls: [decode.url], policy: 'round-robin' },
    env,
  );
  try {
    const port = await proxy.listen(0, '127.0.0.1');
    await proxy.checkHealth();
    for (let i = 0; i < 4; i++) {
      const got = await post(`http://127.0.0.1:${port}`);
      assert.equal(got.status, 200, `request ${i}: ${JSON.stringify(got.json)}`);
    }
    const [pOdd, pGood] = proxy.prefill.members;
    assert.equal(pGood!.healthy, true, String(pGood!.lastError));
    assert.equal(proxy.decode.members[0]!.healthy, true, String(proxy.decode.members[0]!.lastError));
    assert.equal(pOdd!.healthy, false, 'the prefill no decode can pair with is out');
    assert.match(String(pOdd!.lastError), /cannot pair/);
  } finally {
    await proxy.close();
  }
});

test('no prefill can pair with any decode: a completion is 503, not a client 400; /health is 503', async () => {
  const decode = await start({ role: 'decode', modelSeed: 1 });
  const odd = await start({ role: 'prefill', modelSeed: 2 });
  const proxy = new Proxy({ ...DEFAULT_PROXY_OPTIONS, prefillUrls: [odd.url], decodeUrls: [decode.url] }, env);
  try {
    const port = await proxy.listen(0, '127.0.0.1');
    await proxy.checkHealth();
    const got = await post(`http://127.0.0.1:${port}`);
    assert.notEqual(got.status, 400, JSON.stringify(got.json));
    assert.ok(got.status >= 500 || got.status === 409, `${got.status} ${JSON.stringify(got.json)}`);
    const h = await fetch(`http://127.0.0.1:${port}/health`, { signal: AbortSignal.timeout(5000) });
    assert.equal(h.status, 503, 'nothing can serve P/D');
    assert.match(String(proxy.prefill.members[0]!.lastError), /cannot pair with any decode instance/);
  } finally {
    await proxy.close();
  }
});

test('pairing: unknown hashes (vLLM-like, no connector) and an empty other side are never judged', () => {
  const info = (h: string | null | undefined) => ({ compat_hash: h }) as unknown as InstanceInfo;
  const p = (h: string | null | undefined) => ({ side: 'prefill' as const, info: info(h) });
  const d = (h: string | null | undefined) => ({ side: 'decode' as const, info: info(h) });
  assert.equal(unpairedReason(p('a'), [p('a')]), null, 'no decode to judge against');
  assert.equal(unpairedReason(p('a'), [d('b'), d(undefined)]), null, 'an unknown decode may pair');
  assert.equal(unpairedReason(p(null), [d('b')]), null, 'an unknown prefill is not judged');
  assert.equal(unpairedReason({ side: 'prefill', info: null }, [d('b')]), null, 'no /handoff/info');
  assert.equal(unpairedReason(p('a'), [d('b'), d('a')]), null, 'one decode shares it');
  assert.match(String(unpairedReason(p('a'), [d('b')])), /cannot pair with any decode instance/);
});
