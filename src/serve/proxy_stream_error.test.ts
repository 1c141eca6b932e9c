/**
 * handoff_proxy_requests_total{outcome}: a decode that fails a request after its stream started answers
 * 200 and ends the stream with an error event (response_sinks.ts: `data: {"error": ...}` then [DONE]; vLLM
 * does the same). The proxy relayed it unchanged and counted the completion `ok`, so an operator saw no
 * failed completion while every client got an error. Such a stream must count as `error`; a stream that
 * ends normally still counts `ok`.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(43);
type Handler = (req: IncomingMessage, res: ServerResponse) => void;

async function fake(handlers: Record<string, Handler>): Promise<{ url: string; close(): Promise<void> }> {
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const h = handlers[(req.url ?? '').split('?')[0] ?? ''];
      if (h) return h(req, res);
      if (req.url === '/health') return res.end('{}');
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
const tokenEvent = `data: ${JSON.stringify({ id: 'c1', object: 'text_completion', choices: [{ index: 0, text: 'a' }] })}\n\n`;

/** Decode streams one token, then fails the request as our instances and vLLM do (or, `ok`, finishes). */
const decodeStream =
  (fails: boolean): Handler =>
  (_q, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(tokenEvent);
    const error = { error: { message: 'kernel failed', type: 'server_error', code: 'INTERNAL', param: null } };
    res.end(`${fails ? `data: ${JSON.stringify(error)}\n\n` : tokenEvent}data: [DONE]\n\n`);
  };

async function outcomes(url: string): Promise<Record<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^handoff_proxy_requests_total\{outcome="([^"]+)"\} (\d+)$/gm))
    out[m[1] as string] = Number(m[2]);
  return out;
}

for (const fails of [true, false]) {
  test(`a decode stream that ${fails ? 'ends with an error event counts as error' : 'ends normally counts as ok'}`, async () => {
    const prefill = await fake({ '/v1/completions': prefillAnswer });
    const decode = await fake({ '/v1/completions': decodeStream(fails) });
    const proxy = new Proxy(
      { ...DEFAULT_PROXY_OPTIONS, healthTimeoutMs: 500, prefillUrls: [prefill.url], decodeUrls: [decode.url] },
      env,
    );
    const url = `http://127.0.0.1:${await proxy.listen(0, '127.0.0.1')}`;
    await proxy.start();
    try {
      const r = await fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 4, stream: true }),
      });
      assert.equal(r.status, 200);
      const text = await r.text();
      assert.equal(/"error"/.test(text), fails, text);
      assert.deepEqual(await outcomes(url), fails ? { error: 1 } : { ok: 1 });
    } finally {
      await proxy.close();
      await Promise.all([prefill.close(), decode.close()]);
    }
  });
}
