/**
 * A healthy instance whose health check times out once (a busy machine) stays in; only two slow checks
 * in a row take it out (proxy.ts SLOW_CHECKS_MAX). But a request that finds a side with no healthy
 * instance runs a health round of its own (recheck), alongside the periodic one (checkHealth): the two
 * rounds' checks of the same instance timed out together and counted as two in a row, so one slow moment
 * took a healthy instance out. When the decodes restart (none healthy) while prefill is busy, requests
 * arriving meanwhile start such rounds, and prefill is taken out although it never missed two checks in
 * a row: requests are refused (502 "no healthy prefill instance") until a later round brings it back.
 *
 * Before the fix: prefill taken out ("... did not answer within 500 ms") after one slow period. After:
 * a round still under way is the one every caller gets (the periodic tick, a request's recheck).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(19);

async function instance(health: () => 'ok' | 'slow' | 'down'): Promise<{ url: string; server: Server }> {
  const server = createServer((req, res) => {
    req.resume();
    if (req.url === '/health') {
      const h = health();
      if (h === 'slow') return void env.setTimer(3000, () => res.end('{}'));
      return void res.writeHead(h === 'ok' ? 200 : 503).end('{}');
    }
    res.writeHead(req.url === '/handoff/info' ? 404 : 503).end('{}');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server };
}

test("a request's recheck alongside the periodic round does not count one slow check twice", async () => {
  let prefillHealth: 'ok' | 'slow' = 'ok';
  let decodeHealth: 'ok' | 'down' = 'ok';
  const prefill = await instance(() => prefillHealth);
  const decode = await instance(() => decodeHealth);
  const urls = { prefillUrls: [prefill.url], decodeUrls: [decode.url] };
  // No periodic tick of its own within the test: the test runs the periodic round (checkHealth) itself.
  const opts = { ...DEFAULT_PROXY_OPTIONS, ...urls, healthTimeoutMs: 500, healthIntervalMs: 60_000 };
  const proxy = new Proxy(opts, env);
  const port = await proxy.listen(0, '127.0.0.1');
  try {
    await proxy.start();
    assert.equal(proxy.prefill.members[0]!.healthy, true);
    decodeHealth = 'down'; // the decode restarts
    await proxy.checkHealth();
    assert.equal(proxy.decode.numHealthy, 0, 'decode is out');
    prefillHealth = 'slow'; // and prefill is busy for a moment: its next check times out
    const periodic = proxy.checkHealth();
    // A request meanwhile: it finds no healthy decode and asks for a round.
    const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 2 }),
    });
    assert.equal(r.status, 502, 'no healthy decode');
    await periodic;
    const m = proxy.prefill.members[0]!;
    assert.equal(m.healthy, true, `prefill taken out after one slow check: ${String(m.lastError)}`);
    prefillHealth = 'ok';
    await proxy.checkHealth();
    assert.equal(m.healthy, true);
  } finally {
    await proxy.close();
    for (const u of [prefill, decode]) {
      u.server.closeAllConnections();
      await new Promise((res) => u.server.close(res));
    }
  }
});
