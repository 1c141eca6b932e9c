/**
 * The proxy's health checks against a scripted instance: one /health that times out (a busy machine)
 * leaves a healthy instance in; a second in a row takes it out; a 503 (draining) takes it out at once;
 * a good answer brings it back. A vLLM-like instance (empty /health body, no /handoff/info) is healthy;
 * one whose /handoff/info is malformed is taken out naming the field, and the proxy keeps answering.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(29);

/** What our decode instances answer on /handoff/info (instance_server.ts InstanceInfo). */
const INFO = {
  engine_id: 'decode-1',
  role: 'decode',
  model: 'dsv4-mini',
  preset: 'dsv4-mini',
  kv_role: 'kv_consumer',
  transfer_mode: 'read',
  side_channel_host: '127.0.0.1',
  side_channel_port: 5600,
  data_port: 5601,
  max_model_len: 64,
  num_pages: 100,
  block_size: 16,
  prefix_cache_groups: [0],
  kv_events_epoch: '1700000000000-decode-1',
};

/** A scripted decode: /health and /handoff/info as given (null: 404), completions refused with 503. */
async function scripted(
  health: () => { status: number; body: string },
  info: () => unknown,
): Promise<{ url: string; close(): Promise<void> }> {
  const server = createServer((req, res) => {
    if (req.url === '/handoff/info') {
      const i = info();
      if (i === null) return void res.writeHead(404).end();
      return void res.end(typeof i === 'string' ? i : JSON.stringify(i));
    }
    if (req.url === '/health') {
      const h = health();
      return void res.writeHead(h.status).end(h.body);
    }
    res.writeHead(503).end('{}');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

test('health: one slow check is tolerated, two in a row or a 503 mark the instance down', async () => {
  let mode: 'ok' | 'slow' | 'draining' = 'ok';
  const server = createServer((req, res) => {
    if (req.url === '/handoff/info') {
      res.end(JSON.stringify(INFO));
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

test('health: a vLLM-like instance (200 with an empty /health body, no /handoff/info) is healthy', async () => {
  const vllm = await scripted(
    () => ({ status: 200, body: '' }),
    () => null,
  );
  const proxy = new Proxy({ ...DEFAULT_PROXY_OPTIONS, prefillUrls: [vllm.url], decodeUrls: [vllm.url] }, env);
  try {
    await proxy.checkHealth();
    assert.equal(proxy.decode.members[0]!.healthy, true, String(proxy.decode.members[0]!.lastError));
    assert.equal(proxy.decode.members[0]!.info, null);
  } finally {
    await proxy.close();
    await vllm.close();
  }
});

test('health: a malformed /handoff/info takes the instance out naming the field; the proxy keeps answering', async () => {
  const cases: Array<[string, unknown, RegExp]> = [
    ['a negative prefix-cache group', { ...INFO, prefix_cache_groups: [-1] }, /prefix_cache_groups\[0\]/],
    ['a fractional block size', { ...INFO, block_size: 1.5 }, /block_size/],
    ['no prefix-cache groups', { ...INFO, prefix_cache_groups: undefined }, /prefix_cache_groups/],
    ['not JSON', '{', /not JSON/],
    ['not an object', '[1]', /not a JSON object/],
  ];
  for (const [what, info, field] of cases) {
    const inst = await scripted(
      () => ({ status: 200, body: '{}' }),
      () => info,
    );
    const proxy = new Proxy(
      { ...DEFAULT_PROXY_OPTIONS, prefillUrls: ['http://127.0.0.1:9'], decodeUrls: [inst.url], policy: 'kv-aware' },
      env,
    );
    const port = await proxy.listen(0, '127.0.0.1');
    try {
      await proxy.checkHealth();
      const m = proxy.decode.members[0]!;
      assert.equal(m.healthy, false, `${what}: taken out`);
      assert.match(String(m.lastError), /handoff\/info/, what);
      assert.match(String(m.lastError), field, what);
      const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: Array.from({ length: 40 }, (_, i) => 100 + i), max_tokens: 2 }),
      });
      assert.equal(r.status, 502, `${what}: answered (no healthy instance), not crashed`);
    } finally {
      await proxy.close();
      await inst.close();
    }
  }
});
