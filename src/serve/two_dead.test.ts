/**
 * xPyD, two of three prefills gone at once (a node hosting both went down) before a health check noticed.
 * The first request tried the first dead one, was retried once, met the second dead one, and failed with
 * 502 "cannot reach" although a healthy prefill was there all along. A request whose instance is
 * unreachable must be retried for as long as an instance it has not tried can take it (each failed one
 * is left out, so this ends); when none is left the client gets a 502. The upstreams
 * are plain HTTP servers scripted for the purpose (vLLM-like: no /handoff/info).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(43);

async function upstream(answer: unknown): Promise<{ url: string; server: Server; close(): Promise<void> }> {
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url === '/health') return void res.end('');
      if (req.url !== '/v1/completions') return void res.writeHead(404).end('{}');
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(answer));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const close = async (): Promise<void> => {
    server.closeAllConnections();
    if (server.listening) await new Promise<void>((r) => server.close(() => r()));
  };
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server, close };
}

const prefillAnswer = {
  choices: [{ index: 0, text: 'x', finish_reason: 'length' }],
  kv_transfer_params: { do_remote_prefill: true, remote_engine_id: 'p', transfer_id: 't' },
};

test('two of three prefills dead: the request still reaches the live one (not a 502)', async () => {
  const p = [await upstream(prefillAnswer), await upstream(prefillAnswer), await upstream(prefillAnswer)];
  const d = await upstream({ choices: [{ index: 0, text: 'hello', finish_reason: 'length' }] });
  // No periodic check during the test: only the request finds out.
  const proxy = new Proxy(
    { ...DEFAULT_PROXY_OPTIONS, prefillUrls: p.map((u) => u.url), decodeUrls: [d.url], healthIntervalMs: 60_000 },
    env,
  );
  const url = `http://127.0.0.1:${await proxy.listen(0, '127.0.0.1')}`;
  try {
    await proxy.start();
    assert.equal(proxy.prefill.numHealthy, 3);
    await p[0]!.close(); // round robin tries these two first
    await p[1]!.close();
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'hello', max_tokens: 4 }),
      signal: AbortSignal.timeout(8000),
    });
    const json = (await r.json()) as any;
    assert.equal(r.status, 200, JSON.stringify(json));
    assert.equal(json.choices[0].text, 'hello');
    assert.deepEqual(
      proxy.prefill.members.map((m) => m.healthy),
      [false, false, true],
    );
  } finally {
    await proxy.close();
    for (const u of [...p, d]) await u.close();
  }
});

test("every prefill dead: the client gets the first attempt's error, and the loop ends", async () => {
  const p = [await upstream(prefillAnswer), await upstream(prefillAnswer)];
  const d = await upstream({ choices: [] });
  const proxy = new Proxy(
    { ...DEFAULT_PROXY_OPTIONS, prefillUrls: p.map((u) => u.url), decodeUrls: [d.url], healthIntervalMs: 60_000 },
    env,
  );
  const url = `http://127.0.0.1:${await proxy.listen(0, '127.0.0.1')}`;
  try {
    await proxy.start();
    for (const u of p) await u.close();
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'hello', max_tokens: 4 }),
      signal: AbortSignal.timeout(8000),
    });
    const json = (await r.json()) as any;
    assert.equal(r.status, 502, JSON.stringify(json));
    assert.equal(json.error.code, 'PEER_UNAVAILABLE');
    assert.equal(proxy.prefill.numHealthy, 0);
  } finally {
    await proxy.close();
    for (const u of [...p, d]) await u.close();
  }
});
