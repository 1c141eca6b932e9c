/**
 * A kv_both instance listed in both pools (`proxy --prefill X,P --decode X,D`) is one process behind two
 * pool members. When it died, the failed attempt excluded (and marked down) only the member it was
 * reached through, so the retry could send the other leg to the same dead process through its other
 * member, still healthy until the next health check: the retry failed too and the client got a 503 while
 * a live prefill and a live decode were up. Here X dies after the health check; the first attempt's decode
 * leg goes to X (refused), and the retry's prefill went to X as well (round robin): 503 before the fix.
 * Now the dead instance is excluded and marked down in both pools.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { smallInstances } from './small_instances_testkit.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(59);
const start = smallInstances(env);

test('a kv_both instance in both pools dies: the retry goes to live instances only', async () => {
  const x = await start({ role: 'both', kvTransferConfig: JSON.stringify({ kv_connector_extra_config: {} }) });
  const p = await start({ role: 'prefill' });
  const d = await start({ role: 'decode' });
  const proxy = new Proxy(
    { ...DEFAULT_PROXY_OPTIONS, prefillUrls: [x.url, p.url], decodeUrls: [x.url, d.url], policy: 'round-robin' },
    env,
  );
  try {
    const port = await proxy.listen(0, '127.0.0.1');
    await proxy.checkHealth();
    for (const m of [...proxy.prefill.members, ...proxy.decode.members])
      assert.equal(m.healthy, true, `${m.url}: ${String(m.lastError)}`);
    await x.close(); // dies after the health check: both its members still look healthy
    const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'the quick brown fox jumps over the lazy dog', max_tokens: 2, temperature: 0 }),
      signal: AbortSignal.timeout(20_000),
    });
    const text = await r.text();
    assert.equal(r.status, 200, text);
    for (const m of [...proxy.prefill.members, ...proxy.decode.members])
      if (m.url === x.url) assert.equal(m.healthy, false, `the dead instance's ${m.url} member is out`);
  } finally {
    await proxy.close();
  }
});
