/**
 * handoff_proxy_routes_total counts requests by the path they took (pd or decode-only): its series must
 * sum to the completions handled, like handoff_proxy_requests_total. The proxy counted the route of every
 * attempt (in serveRoute), so a request retried on another decode (the first answered 503, draining)
 * counted as two `pd` requests: routes_total{path="pd"} read 2 for 1 completion (requests_total{ok} 1),
 * and a fleet with draining instances showed more P/D requests than it served. After the fix a request is
 * counted once, by the route of the attempt that gave its answer.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(17);
type Handler = (req: IncomingMessage, res: ServerResponse) => void;

async function fake(
  handlers: Record<string, Handler>,
): Promise<{ url: string; hits: string[]; close(): Promise<void> }> {
  const hits: string[] = [];
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const path = (req.url ?? '').split('?')[0] ?? '';
      hits.push(path);
      const h = handlers[path];
      if (h) return h(req, res);
      if (path === '/health') return res.end('{}');
      res.statusCode = 404;
      res.end('{}');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return { url, hits, close: () => new Promise((r) => (server.closeAllConnections(), server.close(() => r()))) };
}

const HELD = { do_remote_prefill: true, remote_engine_id: 'prefill-x', transfer_id: 't', grant: 'g' };
const prefillAnswer: Handler = (_q, res) => {
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify({ choices: [{ text: 'x', index: 0, finish_reason: 'length' }], kv_transfer_params: HELD }));
};
const released: Handler = (_q, res) => res.end('{}');

function series(text: string, name: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const m of text.matchAll(new RegExp(`^${name}\\{[a-z]+="([^"]+)"\\} (\\d+)$`, 'gm')))
    out[m[1] as string] = Number(m[2]);
  return out;
}

test('a request retried on another decode is counted once in handoff_proxy_routes_total', async () => {
  const prefill = await fake({ '/v1/completions': prefillAnswer });
  const draining = await fake({
    '/v1/completions': (_q, res) => {
      res.writeHead(503, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { code: 'OVERLOADED', message: 'the server is draining' } }));
    },
    '/handoff/release': released,
  });
  const good = await fake({
    '/v1/completions': (_q, res) => {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ choices: [{ text: 'hello', index: 0, finish_reason: 'length' }] }));
    },
    '/handoff/release': released,
  });
  const proxy = new Proxy(
    {
      ...DEFAULT_PROXY_OPTIONS,
      healthTimeoutMs: 500,
      prefillUrls: [prefill.url],
      decodeUrls: [draining.url, good.url],
    },
    env,
  );
  const port = await proxy.listen(0, '127.0.0.1');
  await proxy.start();
  const url = `http://127.0.0.1:${port}`;
  try {
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 4 }),
    });
    assert.equal(r.status, 200, await r.text());
    assert.equal(draining.hits.filter((p) => p === '/v1/completions').length, 1, 'the first decode was tried');
    assert.equal(good.hits.filter((p) => p === '/v1/completions').length, 1, 'and the request retried on the other');
    const text = await (await fetch(`${url}/metrics`)).text();
    const requests = series(text, 'handoff_proxy_requests_total');
    const routes = series(text, 'handoff_proxy_routes_total');
    assert.deepEqual(requests, { ok: 1 });
    assert.equal(Number(/^handoff_proxy_retries_total (\d+)$/m.exec(text)?.[1]), 1, 'one retry');
    assert.deepEqual(routes, { pd: 1 }, `one completion counted as ${JSON.stringify(routes)} routes`);
  } finally {
    await proxy.close();
    await Promise.all([prefill.close(), draining.close(), good.close()]);
  }
});

test('1P1D, decode answering 503 (no other instance to retry on): the request is still counted once', async () => {
  const prefill = await fake({ '/v1/completions': prefillAnswer });
  const draining = await fake({
    '/v1/completions': (_q, res) => {
      res.writeHead(503, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { code: 'OVERLOADED', message: 'the server is draining' } }));
    },
    '/handoff/release': released,
  });
  const proxy = new Proxy(
    { ...DEFAULT_PROXY_OPTIONS, healthTimeoutMs: 500, prefillUrls: [prefill.url], decodeUrls: [draining.url] },
    env,
  );
  const port = await proxy.listen(0, '127.0.0.1');
  await proxy.start();
  const url = `http://127.0.0.1:${port}`;
  try {
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 4 }),
    });
    assert.equal(r.status, 503, await r.text());
    const text = await (await fetch(`${url}/metrics`)).text();
    assert.deepEqual(series(text, 'handoff_proxy_requests_total'), { error: 1 });
    assert.deepEqual(series(text, 'handoff_proxy_routes_total'), { pd: 1 });
  } finally {
    await proxy.close();
    await Promise.all([prefill.close(), draining.close()]);
  }
});
