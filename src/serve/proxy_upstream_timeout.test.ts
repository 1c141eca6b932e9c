/**
 * A decode that sends its headers and then stalls its body past the proxy's upstream timeout
 * (`upstreamTimeoutMs`) is reported to the client as what it is: a 504 `TIMEOUT` for a JSON answer, an
 * error event naming the timeout for a stream.
 *
 * Before the fix the upstream timeout aborted the same signal as a client that leaves, and the relay
 * could not tell them apart: the JSON answer became a 499 `REQUEST_ABORTED` "the client went away" sent
 * to a client that was still waiting (counted as a cancel), and the stream's error event said "the
 * request was cancelled mid-response".
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';
import { SseParser } from './sse.ts';

const env = new RealEnv(14);
const HELD = { do_remote_prefill: true, remote_engine_id: 'prefill-x', transfer_id: 't', grant: 'g' };
const UPSTREAM_TIMEOUT_MS = 400;

function listen(s: HttpServer): Promise<string> {
  return new Promise((r) => s.listen(0, '127.0.0.1', () => r(`http://127.0.0.1:${(s.address() as AddressInfo).port}`)));
}

/** Answers health checks; a completion gets its headers and the first bytes, then nothing for 5 s. */
function stallingDecode(stream: boolean): HttpServer {
  return createHttpServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url === '/health') return res.end('{}');
      if (req.url !== '/v1/completions') return res.writeHead(404).end('{}');
      res.writeHead(200, { 'content-type': stream ? 'text/event-stream' : 'application/json' });
      res.write(
        stream ? 'data: {"id":"c1","object":"text_completion","choices":[{"index":0,"text":"a"}]}\n\n' : '{"id"',
      );
      const t = setTimeout(() => res.end(), 5000);
      res.on('close', () => clearTimeout(t));
    });
  });
}

async function ask(stream: boolean): Promise<{ status: number; text: string; metrics: string }> {
  const prefill = createHttpServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url === '/health') return res.end('{}');
      if (req.url !== '/v1/completions') return res.writeHead(404).end('{}');
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ choices: [{ text: 'x', index: 0 }], kv_transfer_params: HELD }));
    });
  });
  const decode = stallingDecode(stream);
  const urls = { prefillUrls: [await listen(prefill)], decodeUrls: [await listen(decode)] };
  const opts = { ...DEFAULT_PROXY_OPTIONS, ...urls, healthTimeoutMs: 500, upstreamTimeoutMs: UPSTREAM_TIMEOUT_MS };
  const proxy = new Proxy(opts, env);
  const url = `http://127.0.0.1:${await proxy.listen(0, '127.0.0.1')}`;
  await proxy.start();
  try {
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 4, stream }),
    });
    const text = await r.text();
    const metrics = await (await fetch(`${url}/metrics`)).text();
    return { status: r.status, text, metrics };
  } finally {
    await proxy.close();
    for (const s of [prefill, decode]) {
      s.closeAllConnections();
      await new Promise((r) => s.close(r));
    }
  }
}

test('a JSON answer stalled past the upstream timeout is a 504 TIMEOUT, not "the client went away"', async () => {
  const { status, text, metrics } = await ask(false);
  assert.equal(status, 504, text);
  const err = (JSON.parse(text) as { error: { code: string; message: string } }).error;
  assert.equal(err.code, 'TIMEOUT', text);
  assert.match(err.message, /400 ms/, 'the message names the timeout');
  assert.doesNotMatch(metrics, /handoff_proxy_requests_total\{[^}]*outcome="cancelled"[^}]*\} 1/, metrics);
});

test('a stream stalled past the upstream timeout ends with an error event naming the timeout', async () => {
  const { status, text } = await ask(true);
  assert.equal(status, 200);
  const events = new SseParser().push(text);
  assert.equal(events.at(-1), '[DONE]', text);
  const last = JSON.parse(events.at(-2) ?? '{}') as { error?: { code?: string; message?: string } };
  assert.equal(last.error?.code, 'TIMEOUT', text);
  assert.match(last.error?.message ?? '', /within 400 ms/, text);
});
