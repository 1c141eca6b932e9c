/**
 * The proxy's health checks against a scripted instance: one /health that times out (a busy machine)
 * leaves a healthy instance in; a second in a row takes it out; a 503 (draining) takes it out at once;
 * a good answer brings it back.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(29);

test('health: one slow check is tolerated, two in a row or a 503 mark the instance down', async () => {
  let mode: 'ok' | 'slow' | 'draining' = 'ok';
  const server = createServer((req, res) => {
    if (req.url === '/handoff/info') {
      res.end(JSON.stringify({ kv_role: 'kv_consumer', transfer_mode: 'read', max_model_len: 64 }));
      return;
    }
    if (mode === 'slow') return void env.setTimer(1500, () => res.end('{}'));
    res.writeHead(mode === 'draining' ? 503 : 200).end('{}');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const proxy = new Proxy(
    { ...DEFAULT_PROXY_OPTIONS, prefillUrls: ['http://127.0.0.1:9'], decodeUrls: [url], healthTimeoutMs: 500 },
    env,
  );
  const healthy = async (): Promise<boolean> => {
    await proxy.checkHealth();
    return proxy.decode.members[0]!.healthy;
  };
  try {
    assert.equal(await healthy(), true);
    mode = 'slow';
    assert.equal(await healthy(), true, 'one slow check: still in');
    assert.equal(await healthy(), false, 'two in a row: out');
    mode = 'ok';
    assert.equal(await healthy(), true, 'back');
    mode = 'draining';
    assert.equal(await healthy(), false, 'a 503 takes it out at once');
    assert.equal(proxy.prefill.members[0]!.healthy, false, 'a refused connection is down');
  } finally {
    await proxy.close();
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  }
});
