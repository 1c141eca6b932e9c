/**
 * Proves: when the retry's decode dies too (two decodes gone at once, a third alive), the pages prefill
 * computed and holds for the retry's dead decode are released through a live decode at once, like the
 * first attempt's. Before, only the first attempt's were: the retry's stayed held on prefill until its
 * 60 s lease, although a live decode could have sent the release.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(41);

type Handler = (req: IncomingMessage, res: ServerResponse, body: string) => void;

interface Fake {
  url: string;
  seen: Array<{ path: string; body: string }>;
  close(): Promise<void>;
}

/** /health 200, anything else 404 unless `handlers` answer the path. */
async function fake(handlers: Record<string, Handler> = {}): Promise<Fake> {
  const seen: Fake['seen'] = [];
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      const path = (req.url ?? '').split('?')[0] ?? '';
      seen.push({ path, body });
      const h = handlers[path];
      if (h) return h(req, res, body);
      if (path === '/health') return res.end('{}');
      res.statusCode = 404;
      res.end('{}');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    seen,
    close: () => new Promise((r) => (server.closeAllConnections(), server.close(() => r()))),
  };
}

/** A decode that dies on every completion (its connection reset before any answer). */
const dying: Record<string, Handler> = {
  '/v1/completions': (_q, res) => res.socket?.destroy(),
  '/handoff/release': (_q, res) => res.socket?.destroy(),
};

test('the retry decode dying too: prefill pages held for it are released through a live decode', async () => {
  let grants = 0;
  const prefill = await fake({
    '/v1/completions': (_q, res) => {
      const held = { do_remote_prefill: false, do_remote_decode: true, transfer_id: 't', grant: `g${++grants}` };
      res.setHeader('content-type', 'application/json');
      res.end(
        JSON.stringify({ choices: [{ text: 'x', index: 0, finish_reason: 'length' }], kv_transfer_params: held }),
      );
    },
  });
  const live = await fake({
    '/handoff/release': (_q, res) => res.end('{"released":true}'),
    // The third attempt (review: retried while an untried decode is left) is answered here.
    '/v1/completions': (_q, res) => res.end('{"choices":[{"index":0,"text":"ok","finish_reason":"length"}]}'),
  });
  const [d1, d2] = await Promise.all([fake(dying), fake(dying)]);
  // Round robin: attempt 1 goes to d1, its release to `live`, the retry to d2, the next one to `live`.
  const proxy = new Proxy(
    {
      ...DEFAULT_PROXY_OPTIONS,
      healthTimeoutMs: 500,
      prefillUrls: [prefill.url],
      decodeUrls: [d1.url, live.url, d2.url],
    },
    env,
  );
  const port = await proxy.listen(0, '127.0.0.1');
  await proxy.start();
  try {
    const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 4 }),
    });
    await r.text();
    assert.equal(r.status, 200);
    assert.equal(grants, 3, 'prefill answered all three attempts');
    const seenGrants = (): string[] =>
      live.seen
        .filter((s) => s.path === '/handoff/release')
        .map((s) => String((JSON.parse(s.body) as { kv_transfer_params: { grant: string } }).kv_transfer_params.grant))
        .sort();
    for (let i = 0; i < 100 && seenGrants().length < 2; i++) await env.sleep(20);
    assert.deepEqual(seenGrants(), ['g1', 'g2'], 'both attempts held pages on prefill; both are released');
  } finally {
    await proxy.close();
    await Promise.all([prefill, live, d1, d2].map((f) => f.close()));
  }
});
