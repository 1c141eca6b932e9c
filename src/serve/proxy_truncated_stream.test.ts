/**
 * A decode event stream that ends before its `data: [DONE]` reaches the proxy's client as a failure: an
 * error event, then `[DONE]`, and the completion counted as an error.
 *
 * An upstream whose SSE body is delimited by the connection's close (HTTP/1.1 `connection: close`, no
 * chunked encoding, as HTTP/1.0-style servers and some intermediaries send it) and that dies mid-stream
 * ends it with a plain FIN: fetch sees a clean end of body, not an error. (A chunked stream cut so is
 * an error, `proxy_edges.test.ts`.) Also a stream cut inside an event: its half event was relayed as is.
 * A JSON answer cut so was relayed as a 200 whose body does not parse (the relay reads JSON whole so
 * that a decode dying mid-answer fails the attempt, but checked only for a broken connection).
 *
 * Before the fix: the proxy relayed the cut stream as a normal 200 that just stopped: no error event, no
 * `[DONE]`, counted `ok` in handoff_proxy_requests_total; an OpenAI client sees an answer with no
 * finish_reason and no error, as if it were whole.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import { createServer, type AddressInfo, type Server } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';
import { SseParser } from './sse.ts';

const env = new RealEnv(13);
const HELD = { do_remote_prefill: true, remote_engine_id: 'prefill-x', transfer_id: 't', grant: 'g' };
const CHUNK = { id: 'c1', object: 'text_completion', choices: [{ index: 0, text: 'a' }] };
const EVENT = `data: ${JSON.stringify(CHUNK)}\n\n`;

function listen(s: Server | HttpServer): Promise<string> {
  return new Promise((r) => s.listen(0, '127.0.0.1', () => r(`http://127.0.0.1:${(s.address() as AddressInfo).port}`)));
}

/** A decode that answers /v1/completions with a close-delimited body (`contentType`), then a FIN. */
function rawDecode(body: string, contentType: string): Server {
  return createServer((s) => {
    let head = '';
    s.on('error', () => {});
    s.on('data', (b: Buffer) => {
      head += b.toString('latin1');
      if (!head.includes('\r\n\r\n')) return;
      if (head.startsWith('GET /health')) {
        s.end('HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}');
        return;
      }
      if (head.startsWith('GET ')) {
        s.end('HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}');
        return;
      }
      const len = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
      if (Buffer.byteLength(head.slice(head.indexOf('\r\n\r\n') + 4), 'latin1') < len) return;
      s.write(`HTTP/1.1 200 OK\r\ncontent-type: ${contentType}\r\nconnection: close\r\n\r\n`);
      s.write(body);
      setTimeout(() => s.end(), 50); // the process dies: the kernel closes its socket with a FIN
    });
  });
}

async function relayed(
  body: string,
  stream = true,
): Promise<{ status: number; events: string[]; text: string; metrics: string }> {
  const prefill = createHttpServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url === '/health') return res.end('{}');
      if (req.url !== '/v1/completions') return res.writeHead(404).end('{}');
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ choices: [{ text: 'x', index: 0 }], kv_transfer_params: HELD }));
    });
  });
  const decode = rawDecode(body, stream ? 'text/event-stream' : 'application/json');
  const urls = { prefillUrls: [await listen(prefill)], decodeUrls: [await listen(decode)] };
  const proxy = new Proxy({ ...DEFAULT_PROXY_OPTIONS, ...urls, healthTimeoutMs: 500 }, env);
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
    return { status: r.status, events: stream ? new SseParser().push(text) : [], text, metrics };
  } finally {
    await proxy.close();
    prefill.closeAllConnections();
    await new Promise((r) => prefill.close(r));
    await new Promise((r) => decode.close(r));
  }
}

function assertEndsInError(events: string[], text: string): void {
  assert.equal(events.at(-1), '[DONE]', `the stream ends with [DONE]:\n${text}`);
  const last = JSON.parse(events.at(-2) ?? '{}') as { error?: { code?: string } };
  assert.equal(last.error?.code, 'PEER_UNAVAILABLE', `an error event says the stream was cut:\n${text}`);
  for (const e of events.slice(0, -1)) assert.doesNotThrow(() => JSON.parse(e), `every event parses:\n${text}`);
}

test('a decode stream that ends (FIN) between events without [DONE] ends in an error event and [DONE]', async () => {
  const { status, events, text, metrics } = await relayed(EVENT);
  assert.equal(status, 200);
  assertEndsInError(events, text);
  assert.match(metrics, /handoff_proxy_requests_total\{[^}]*outcome="error"[^}]*\} 1/, 'counted as an error');
});

test('a decode stream that ends (FIN) inside an event ends in an error event, not a half event', async () => {
  const { events, text } = await relayed(EVENT + 'data: {"id":"c1","object":"text_com');
  assertEndsInError(events, text);
});

test('a whole stream (its [DONE] included) is relayed unchanged', async () => {
  const { text, metrics } = await relayed(EVENT + 'data: [DONE]\n\n');
  assert.equal(text, EVENT + 'data: [DONE]\n\n');
  assert.match(metrics, /handoff_proxy_requests_total\{[^}]*outcome="ok"[^}]*\} 1/);
});

test('a JSON answer cut by a FIN is a 502 PEER_UNAVAILABLE, not a 200 with broken JSON', async () => {
  const whole = JSON.stringify({ id: 'c1', object: 'text_completion', choices: [{ index: 0, text: 'abc' }] });
  const { status, text } = await relayed(whole.slice(0, 30), false);
  assert.equal(status, 502, text);
  assert.equal((JSON.parse(text) as { error: { code: string } }).error.code, 'PEER_UNAVAILABLE');
  const ok = await relayed(whole, false);
  assert.equal(ok.status, 200);
  assert.equal(ok.text, whole, 'a whole JSON answer is relayed unchanged');
});
