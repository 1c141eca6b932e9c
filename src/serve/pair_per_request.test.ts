/**
 * Pairing is judged per request, not only per instance. With two compatible pairs of different weights
 * behind one proxy (a rolling upgrade: prefill A and decode A on the old --seed, prefill B and decode B on
 * the new one), every instance pairs with someone, so the health check keeps all four in; but routing
 * chose the prefill without looking at the decode it had chosen, so a request could go to prefill A and
 * decode B, whose handshake refuses: the client got 409 PEER_INCOMPATIBLE although a compatible pair was
 * up. Listed in opposite orders, the two pools' round robins paired them wrongly on every request (each
 * request failed before the fix). Now a prefill whose compat_hash differs from the chosen decode's is not
 * routed to, under every policy.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { smallInstances } from './small_instances_testkit.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';
import type { RoutingPolicy } from './instance_pool.ts';

const env = new RealEnv(53);
const start = smallInstances(env);

const body = (i: number): string =>
  JSON.stringify({
    prompt: `request ${i}: the quick brown fox jumps over the lazy dog`,
    max_tokens: 2,
    temperature: 0,
  });

for (const policy of ['round-robin', 'least-loaded', 'kv-aware'] as RoutingPolicy[]) {
  test(`${policy}: two pairs of different weights; every request goes to a prefill its decode can pair with`, async () => {
    const pA = await start({ role: 'prefill', modelSeed: 1 });
    const pB = await start({ role: 'prefill', modelSeed: 2 });
    const dB = await start({ role: 'decode', modelSeed: 2 });
    const dA = await start({ role: 'decode', modelSeed: 1 });
    const proxy = new Proxy(
      { ...DEFAULT_PROXY_OPTIONS, prefillUrls: [pA.url, pB.url], decodeUrls: [dB.url, dA.url], policy },
      env,
    );
    try {
      const port = await proxy.listen(0, '127.0.0.1');
      await proxy.checkHealth();
      for (const m of [...proxy.prefill.members, ...proxy.decode.members])
        assert.equal(m.healthy, true, `${m.url}: ${String(m.lastError)}`);
      const got: string[] = [];
      for (let i = 0; i < 4; i++) {
        const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: body(i),
          signal: AbortSignal.timeout(20_000),
        });
        const text = await r.text();
        got.push(`${r.status}${r.status === 200 ? '' : ` ${text.slice(0, 160)}`}`);
      }
      assert.deepEqual(got, ['200', '200', '200', '200']);
    } finally {
      await proxy.close();
    }
  });
}
