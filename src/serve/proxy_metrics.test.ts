/** The proxy's handoff_proxy_requests_total must tell the truth about each completion's outcome. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(7);
type Handler = (req: IncomingMessage, res: ServerResponse) => void;

async function fake(handlers: Record<string, Handler>): Promise<{ url: string; close(): Promise<void> }> {
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const path = (req.url ?? '').split('?')[0] ?? '';
      const h = handlers[path];
      if (h) return h(req, res);
      if (path === '/health') return res.end('{}');
      res.statusCode = 404;
      res.end('{}');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return { url, close: () => new Promise((r) => (server.closeAllConnections(), server.close(() => r()))) };
}

const HELD = { do_remote_prefill: true, remote_engine_id: 'prefill-x', transfer_id: 't', grant: 'g' };
const prefillAnswer: Handler = (_q, res) => {
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify({ choices: [{ text: 'x', index: 0, finish_reason: 'length' }], kv_transfer_params: HELD }));
};

async function outcomes(url: string): Promise<Record<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^handoff_proxy_requests_total\{outcome="([^"]+)"\} (\d+)$/gm))
    out[m[1] as string] = Number(m[2]);
  return out;
}

async function startProxy(prefill: string, decode: string): Promise<{ proxy: Proxy; url: string }> {
  const proxy = new Proxy(
    { ...DEFAULT_PROXY_OPTIONS, healthTimeoutMs: 500, prefillUrls: [prefill], decodeUrls: [decode] },
    env,
  );
  const port = await proxy.listen(0, '127.0.0.1');
  await proxy.start();
  return { proxy, url: `http://127.0.0.1:${port}` };
}

test('a decode that dies mid-stream is not counted as an ok completion', async () => {
  const prefill = await fake({ '/v1/completions': prefillAnswer });
  const decode = await fake({
    '/v1/completions': (_q, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(
        `data: ${JSON.stringify({ id: 'c1', object: 'text_completion', choices: [{ index: 0, text: 'a' }] })}\n\n`,
      );
      void env.sleep(100).then(() => res.socket?.destroy());
    },
  });
  const { proxy, url } = await startProxy(prefill.url, decode.url);
  try {
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 4, stream: true }),
    });
    const text = await r.text();
    assert.match(text, /"error"/, 'the client got an error event');
    const o = await outcomes(url);
    assert.equal(o['ok'] ?? 0, 0, `a failed completion counted ok: ${JSON.stringify(o)}`);
    assert.equal(o['error'], 1, JSON.stringify(o));
  } finally {
    await proxy.close();
    await Promise.all([prefill.close(), decode.close()]);
  }
});

test('requests that are not completions (404 paths) are not counted as failed completions', async () => {
  const prefill = await fake({ '/v1/completions': prefillAnswer });
  const decode = await fake({});
  const { proxy, url } = await startProxy(prefill.url, decode.url);
  try {
    for (let i = 0; i < 3; i++) assert.equal((await fetch(`${url}/favicon.ico`)).status, 404);
    const o = await outcomes(url);
    assert.equal(o['error'] ?? 0, 0, `404s counted as completions: ${JSON.stringify(o)}`);
  } finally {
    await proxy.close();
    await Promise.all([prefill.close(), decode.close()]);
  }
});

test('1P1D, decode answering 503: nothing is retried, so handoff_proxy_retries_total stays 0', async () => {
  const prefill = await fake({ '/v1/completions': prefillAnswer });
  const decode = await fake({
    '/v1/completions': (_q, res) => {
      res.writeHead(503, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { code: 'OVERLOADED', message: 'draining' } }));
    },
    '/handoff/release': (_q, res) => res.end('{}'),
  });
  const { proxy, url } = await startProxy(prefill.url, decode.url);
  try {
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 4 }),
    });
    assert.equal(r.status, 503);
    const text = await (await fetch(`${url}/metrics`)).text();
    const retries = Number(/^handoff_proxy_retries_total (\d+)$/m.exec(text)?.[1]);
    assert.equal(retries, 0, 'a retry counted where no other instance took the request');
  } finally {
    await proxy.close();
    await Promise.all([prefill.close(), decode.close()]);
  }
});
