/**
 * The proxy against scripted upstreams, at the edges where an instance or a client misbehaves:
 * - an event stream cut mid-event: the client gets whole events, then an error event that parses;
 * - prefill resetting after its headers, or answering 200 with a body that is not JSON: the instance is
 *   taken out and the request retried elsewhere (not a 500 INTERNAL);
 * - 1P1D, an upstream 503 (overloaded, draining): the client gets that 503, not "no healthy instance";
 * - a client that stops reading: the relay gives up when the upstream times out and the decode's
 *   in-flight count comes back;
 * - WRITE mode, prefill failing after decode started streaming: the stream ends with an error event;
 * - a client gone while the proxy waited (a health re-check): nothing is sent to decode;
 * - an error in vLLM's shape (a numeric code) keeps its status's meaning (400: invalid_request_error);
 * - a body read whole is bounded (64 MiB for answers, 1 MiB for error bodies, 96 MiB for a KV dump).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { PromptChains } from './kv_router.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy, type ProxyOptions } from './proxy.ts';
import { SseParser } from './sse.ts';
import { readBoundedText } from './upstream.ts';
import { HandoffError } from '../util/errors.ts';

const env = new RealEnv(7);

interface Seen {
  method: string;
  path: string;
  headers: IncomingMessage['headers'];
  body: string;
}

type Handler = (req: IncomingMessage, res: ServerResponse, body: string) => void;

interface Fake {
  url: string;
  seen: Seen[];
  close(): Promise<void>;
}

/** A fake upstream: /health '{}' 200, /handoff/info 404 unless `handlers` answer the path. */
async function fake(handlers: Record<string, Handler> = {}): Promise<Fake> {
  const seen: Seen[] = [];
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      const path = (req.url ?? '').split('?')[0] ?? '';
      seen.push({ method: req.method ?? '', path, headers: req.headers, body });
      const h = handlers[path];
      if (h) return h(req, res, body);
      if (path === '/health') return res.end('{}');
      res.statusCode = 404;
      res.end('{}');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url,
    seen,
    close: () => new Promise((r) => (server.closeAllConnections(), server.close(() => r()))),
  };
}

async function startProxy(
  o: Partial<ProxyOptions> & Pick<ProxyOptions, 'prefillUrls' | 'decodeUrls'>,
): Promise<{ proxy: Proxy; url: string }> {
  const proxy = new Proxy({ ...DEFAULT_PROXY_OPTIONS, healthTimeoutMs: 500, ...o }, env);
  const port = await proxy.listen(0, '127.0.0.1');
  await proxy.start();
  return { proxy, url: `http://127.0.0.1:${port}` };
}

const HELD = { do_remote_prefill: true, remote_engine_id: 'prefill-x', transfer_id: 't', grant: 'g' };

/** A prefill answer with kv_transfer_params. */
function prefillAnswer(res: ServerResponse): void {
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify({ choices: [{ text: 'x', index: 0, finish_reason: 'length' }], kv_transfer_params: HELD }));
}

test('decode dying mid-event: every event the client gets is parseable, and the error event arrives', async () => {
  const prefill = await fake({ '/v1/completions': (_q, res) => prefillAnswer(res) });
  const decode = await fake({
    '/v1/completions': (_q, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      res.write(
        `data: ${JSON.stringify({ id: 'c1', object: 'text_completion', choices: [{ index: 0, text: 'a' }] })}\n\n`,
      );
      // half of the next event, then the process dies (connection reset)
      res.write('data: {"id":"c1","object":"text_completion","choi');
      void env.sleep(100).then(() => res.socket?.destroy());
    },
  });
  const { proxy, url } = await startProxy({ prefillUrls: [prefill.url], decodeUrls: [decode.url] });
  try {
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 4, stream: true }),
    });
    assert.equal(r.status, 200);
    const text = await r.text();
    const events = new SseParser().push(text);
    const bad = events.filter((e) => {
      if (e === '[DONE]') return false;
      try {
        JSON.parse(e);
        return false;
      } catch {
        return true;
      }
    });
    assert.deepEqual(bad, [], `events that are not JSON in the relayed stream:\n${text}`);
    assert.ok(
      events.some((e) => e !== '[DONE]' && (JSON.parse(e) as { error?: unknown }).error !== undefined),
      'an error event ends the stream',
    );
  } finally {
    await proxy.close();
    await Promise.all([prefill.close(), decode.close()]);
  }
});

const decodeOk = {
  '/v1/completions': (_q: unknown, res: import('node:http').ServerResponse) => {
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ choices: [{ text: 'hello', index: 0, finish_reason: 'length' }] }));
  },
};

async function post(url: string): Promise<{ status: number; body: any }> {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 4 }),
  });
  return { status: r.status, body: await r.json() };
}

test('prefill reset after its headers: the request is retried on the other prefill (not a 500 INTERNAL)', async () => {
  const dying = await fake({
    '/v1/completions': (_q, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"choices":[{"text":"x"');
      void env.sleep(50).then(() => res.socket?.destroy());
    },
  });
  const good = await fake({ '/v1/completions': (_q, res) => prefillAnswer(res) });
  const decode = await fake(decodeOk);
  const { proxy, url } = await startProxy({ prefillUrls: [dying.url, good.url], decodeUrls: [decode.url] });
  try {
    const got = await post(url);
    assert.notEqual(got.body?.error?.code, 'INTERNAL', `answered as an internal error: ${JSON.stringify(got.body)}`);
    assert.equal(got.status, 200, JSON.stringify(got.body));
    assert.equal(good.seen.filter((s) => s.path === '/v1/completions').length, 1, 'retried on the other prefill');
  } finally {
    await proxy.close();
    await Promise.all([dying.close(), good.close(), decode.close()]);
  }
});

test('prefill answering 200 with a body that is not JSON is a 5xx upstream error, not INTERNAL', async () => {
  const html = await fake({
    '/v1/completions': (_q, res) => {
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end('<html>gateway</html>');
    },
  });
  const decode = await fake(decodeOk);
  const { proxy, url } = await startProxy({ prefillUrls: [html.url], decodeUrls: [decode.url] });
  try {
    const got = await post(url);
    assert.notEqual(got.body?.error?.code, 'INTERNAL', `answered as an internal error: ${JSON.stringify(got.body)}`);
  } finally {
    await proxy.close();
    await Promise.all([html.close(), decode.close()]);
  }
});

test('1P1D: prefill answering 503 OVERLOADED reaches the client as 503 OVERLOADED, not 502 "no healthy prefill"', async () => {
  const prefill = await fake({
    '/v1/completions': (_q, res) => {
      res.writeHead(503, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          error: { message: 'out of KV pages', type: 'server_error', code: 'OVERLOADED', param: null },
        }),
      );
    },
  });
  const decode = await fake();
  const { proxy, url } = await startProxy({ prefillUrls: [prefill.url], decodeUrls: [decode.url] });
  try {
    const { status, body } = await post(url);
    assert.equal(proxy.prefill.members[0]!.healthy, true, 'the prefill instance is still healthy in the pool');
    assert.equal(status, 503, JSON.stringify(body));
    assert.equal(body.error.code, 'OVERLOADED');
    assert.match(body.error.message, /^prefill: /);
  } finally {
    await proxy.close();
    await Promise.all([prefill.close(), decode.close()]);
  }
});

test('upstream timeout ends a relay stuck on a client that stopped reading (in-flight count returns to 0)', async () => {
  let decodeClosed = false;
  const prefill = await fake({ '/v1/completions': (_q, res) => prefillAnswer(res) });
  const decode = await fake({
    '/v1/completions': (_q, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.on('close', () => (decodeClosed = true));
      const ev = `data: ${JSON.stringify({ choices: [{ index: 0, text: 'x'.repeat(4000) }] })}\n\n`;
      let sent = 0;
      const pump = (): void => {
        while (!decodeClosed && sent < 256 << 20) {
          sent += ev.length;
          if (!res.write(ev)) return void res.once('drain', pump);
        }
      };
      pump();
    },
  });
  const { proxy, url } = await startProxy({
    prefillUrls: [prefill.url],
    decodeUrls: [decode.url],
    upstreamTimeoutMs: 1500,
  });
  const port = Number(new URL(url).port);
  const sock = connect(port, '127.0.0.1');
  sock.on('error', () => {});
  try {
    await new Promise<void>((r) => sock.once('connect', () => r()));
    const body = JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 4, stream: true });
    sock.write(
      `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`,
    );
    sock.pause(); // the client stays connected but reads nothing more
    for (let k = 0; k < 500 && !decodeClosed; k++) await env.sleep(10);
    assert.equal(decodeClosed, true, 'the upstream timeout dropped the decode leg');
    for (let k = 0; k < 200 && proxy.decode.members[0]!.inflight > 0; k++) await env.sleep(10);
    assert.equal(
      proxy.decode.members[0]!.inflight,
      0,
      'decode leg timed out 2 s ago, yet the proxy still counts it in flight (relay parked on drain)',
    );
  } finally {
    sock.destroy();
    await proxy.close();
    await Promise.all([prefill.close(), decode.close()]);
  }
});

/** /handoff/info of a fake instance (instance_server.ts InstanceInfo). */
const infoOf =
  (mode: 'read' | 'write', groups: number[], epoch: string) =>
  (role: 'prefill' | 'decode') =>
  (_q: unknown, res: ServerResponse) => {
    res.setHeader('content-type', 'application/json');
    res.end(
      JSON.stringify({
        engine_id: `${role}-engine`,
        role,
        model: 'm',
        preset: 'm',
        kv_role: role === 'prefill' ? 'kv_producer' : 'kv_consumer',
        transfer_mode: mode,
        side_channel_host: '127.0.0.1',
        side_channel_port: 5555,
        data_port: null,
        max_model_len: 512,
        num_pages: 64,
        block_size: 16,
        prefix_cache_groups: groups,
        kv_events_epoch: epoch,
      }),
    );
  };
const writeInfo = infoOf('write', [], '1-x');

test('WRITE: prefill failing after decode started streaming ends the client stream with an error event', async () => {
  const prefill = await fake({
    '/handoff/info': writeInfo('prefill'),
    '/v1/completions': (_q, res) => {
      // pushes its KV (decode starts streaming), then dies before answering
      void env.sleep(300).then(() => res.socket?.destroy());
    },
  });
  const decode = await fake({
    '/handoff/info': writeInfo('decode'),
    '/v1/completions': (_q, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      let i = 0;
      const tick = (): void => {
        if (res.destroyed) return;
        res.write(`data: ${JSON.stringify({ id: 'c', choices: [{ index: 0, text: `t${i}` }] })}\n\n`);
        if (++i < 20) void env.sleep(50).then(tick);
        else res.end('data: [DONE]\n\n');
      };
      tick();
    },
  });
  const { proxy, url } = await startProxy({ prefillUrls: [prefill.url], decodeUrls: [decode.url], mode: 'write' });
  try {
    assert.ok(proxy.healthy, 'both instances up');
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'hi', max_tokens: 20, stream: true }),
    });
    assert.equal(r.status, 200);
    const text = await r.text().catch((e: Error) => `<<body read failed: ${e.message}>>`);
    const events = new SseParser().push(text);
    const tokens = events.filter((e) => e !== '[DONE]' && !('error' in (JSON.parse(e) as object)));
    assert.ok(tokens.length > 0, 'tokens had been streamed');
    const ended = events.includes('[DONE]');
    const errorEvent = events.some((e) => e !== '[DONE]' && 'error' in (JSON.parse(e) as object));
    assert.ok(
      errorEvent || (ended && tokens.length === 20),
      `the stream stopped after ${tokens.length} tokens with no error event and no [DONE]:\n${text}`,
    );
  } finally {
    await proxy.close();
    await Promise.all([prefill.close(), decode.close()]);
  }
});

const readInfo = infoOf('read', [0], '1000-x');

test('kv-aware decode-only: a client gone before the upstream call is not sent to decode (or is cancelled at once)', async () => {
  let slowHealth = false;
  let decodeGot = false;
  let decodeDropped = false;
  const prefill = await fake({ '/handoff/info': readInfo('prefill') });
  const decode = await fake({
    '/handoff/info': readInfo('decode'),
    '/health': (_q, res) => void env.sleep(slowHealth ? 300 : 0).then(() => res.end('{}')),
    '/v1/completions': (_q, res) => {
      decodeGot = true;
      res.on('close', () => (decodeDropped = !res.writableFinished));
      // a long non-streamed generation
      void env.sleep(1500).then(() => {
        if (res.destroyed) return;
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify({ choices: [{ text: 'done', index: 0, finish_reason: 'length' }] }));
      });
    },
  });
  const { proxy, url } = await startProxy({ prefillUrls: [prefill.url], decodeUrls: [decode.url], policy: 'kv-aware' });
  const prompt = Array.from({ length: 40 }, (_, i) => 100 + i);
  const chains = new PromptChains(prompt);
  proxy.index.applyDump(decode.url, {
    epoch: '1000-x',
    seq: 1,
    block_hashes: [chains.hash(16, 0, 0), chains.hash(16, 0, 1)],
  });
  const sock = connect(Number(new URL(url).port), '127.0.0.1');
  sock.on('error', () => {});
  try {
    assert.ok(proxy.healthy);
    proxy.decode.markDown(proxy.decode.members[0]!, 'missed one check'); // the request will recheck first
    slowHealth = true;
    await new Promise<void>((r) => sock.once('connect', () => r()));
    const body = JSON.stringify({ prompt, max_tokens: 200 });
    sock.write(
      `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`,
    );
    await env.sleep(100);
    sock.destroy(); // the client leaves while the proxy re-checks health
    await env.sleep(700);
    if (decodeGot) assert.equal(proxy.router.stats.skippedPrefill, 1, 'it went the decode-only route');
    assert.ok(!decodeGot || decodeDropped, 'the request of a client already gone was sent to decode and left running');
  } finally {
    sock.destroy();
    await proxy.close();
    await Promise.all([prefill.close(), decode.close()]);
  }
});

test('a vLLM 400 from decode reaches the client as a 4xx-typed OpenAI error', async () => {
  const prefill = await fake({ '/v1/completions': (_q, res) => prefillAnswer(res) });
  const decode = await fake({
    '/v1/completions': (_q, res) => {
      res.writeHead(400, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          error: { message: "'temperature' must be >= 0", type: 'BadRequestError', param: 'temperature', code: 400 },
        }),
      );
    },
  });
  const { proxy, url } = await startProxy({ prefillUrls: [prefill.url], decodeUrls: [decode.url] });
  try {
    const { status, body } = await post(url);
    assert.equal(status, 400);
    assert.equal(body.error.param, 'temperature');
    assert.equal(body.error.type, 'invalid_request_error', `HTTP 400 labelled as: ${JSON.stringify(body)}`);
    assert.notEqual(body.error.code, 'INTERNAL', JSON.stringify(body));
  } finally {
    await proxy.close();
    await Promise.all([prefill.close(), decode.close()]);
  }
});

test('bodies read whole are bounded: exactly the bound is read, one byte more is PEER_UNAVAILABLE and the rest is cancelled', async () => {
  let cancelled = false;
  // `open`: the peer keeps the body open after these chunks (it would never stop sending).
  const body = (sizes: number[], open = false): Response =>
    new Response(
      new ReadableStream<Uint8Array>({
        start(c) {
          for (const n of sizes) c.enqueue(new Uint8Array(n).fill(0x61));
          if (!open) c.close();
        },
        cancel() {
          cancelled = true;
        },
      }),
    );
  assert.equal((await readBoundedText(body([3, 4, 3]), 10, 'x')).length, 10);
  await assert.rejects(readBoundedText(body([3, 4, 4], true), 10, 'the decode instance'), (e: unknown) => {
    assert.ok(e instanceof HandoffError && e.code === 'PEER_UNAVAILABLE', String(e));
    assert.match(e.message, /the decode instance sent more than 10 bytes/);
    return true;
  });
  assert.ok(cancelled, 'the rest of the body is cancelled');
});
