/**
 * The proxy's upstream calls are bounded by ProxyOptions.upstreamTimeoutMs (default 10 minutes) and by
 * nothing else. Node's fetch (its bundled undici) has bounds of its own: 300 s for a response's headers
 * and 300 s between body chunks. An instance sends a non-streamed answer's headers only with the whole
 * answer, and a stream's only with its first token, so a completion that took decode longer than 300 s
 * (a long non-streamed answer, or one queued behind others) failed at the proxy with 502
 * PEER_UNAVAILABLE ("cannot reach ...: UND_ERR_HEADERS_TIMEOUT") and the healthy decode was marked down,
 * although the proxy was set to wait 600 s.
 *
 * undici's bound is real time, so the test scales it down: the process's global dispatcher (the one
 * Node's fetch uses unless told otherwise) is replaced by one whose header and body bounds are 1 s, and
 * decode answers after 2.5 s with upstreamTimeoutMs 10 s. Before the fix the proxy's call used that
 * dispatcher and failed after 1 s, as it failed after 300 s with the default one.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, request, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(5);
const DECODE_DELAY_MS = 2500;
const GLOBAL_DISPATCHER = Symbol.for('undici.globalDispatcher.1');

async function serve(handle: (res: ServerResponse) => void): Promise<{ server: Server; url: string }> {
  const server: Server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const path = (req.url ?? '').split('?')[0] ?? '';
      if (path === '/health') return res.end('{}');
      if (path !== '/v1/completions') return res.writeHead(404).end('{}');
      handle(res);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

/** Node's fetch with its bounds at `ms` from now on; returns a function that restores the old dispatcher. */
async function boundGlobalFetch(ms: number): Promise<() => void> {
  await fetch('data:,'); // Node makes its global dispatcher on first use
  const slot = globalThis as unknown as Record<symbol, { constructor: new (o: object) => object }>;
  const old = slot[GLOBAL_DISPATCHER];
  assert.ok(old !== undefined && old.constructor.name === 'Agent', 'Node 20 keeps an undici Agent here');
  slot[GLOBAL_DISPATCHER] = new old.constructor({ headersTimeout: ms, bodyTimeout: ms }) as never;
  return () => void (slot[GLOBAL_DISPATCHER] = old);
}

test('a decode answer slower than fetch’s own header bound reaches the client (upstreamTimeoutMs bounds it)', async () => {
  const restore = await boundGlobalFetch(1000);
  const answer = { id: 'c', object: 'text_completion', choices: [{ index: 0, text: 'ok', finish_reason: 'length' }] };
  const prefill = await serve((res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ ...answer, kv_transfer_params: { transfer_id: 't', remote_block_ids: [] } }));
  });
  const decode = await serve((res) => {
    const t = setTimeout(() => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(answer));
    }, DECODE_DELAY_MS);
    res.on('close', () => clearTimeout(t));
  });
  const urls = { prefillUrls: [prefill.url], decodeUrls: [decode.url] };
  const proxy = new Proxy({ ...DEFAULT_PROXY_OPTIONS, ...urls, upstreamTimeoutMs: 10_000, healthTimeoutMs: 500 }, env);
  const port = await proxy.listen(0, '127.0.0.1');
  try {
    await proxy.start();
    // node:http, not fetch: the test's own client is not bounded by the dispatcher under test.
    const { status, text } = await new Promise<{ status: number; text: string }>((resolve, reject) => {
      const req = request({ host: '127.0.0.1', port, path: '/v1/completions', method: 'POST' }, (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, text: body }));
      });
      req.on('error', reject);
      req.setHeader('content-type', 'application/json');
      req.end(JSON.stringify({ prompt: 'hello', max_tokens: 4 }));
    });
    assert.equal(status, 200, text);
    assert.equal((JSON.parse(text) as typeof answer).choices[0]?.text, 'ok');
  } finally {
    restore();
    await proxy.close();
    for (const s of [prefill.server, decode.server]) {
      s.closeAllConnections();
      await new Promise((r) => s.close(r));
    }
  }
});
