/**
 * The proxy drops an answer its client takes nothing of (what withStallBound does on the instance server).
 * A client sends a non-streaming completion and then never reads: decode's JSON answer (read whole, up to
 * 64 MiB) is written with res.end() and the completion is over for the proxy, but the answer stays queued
 * in the proxy's memory behind a full TCP window.
 *
 * Before the fix: nothing ever timed that out (the proxy's server has no socket timeout, and
 * keepAliveTimeout only counts once the response is flushed): the connection and its queued megabytes
 * stayed for good, so clients that never read grew the proxy's memory without bound. The streaming relay
 * has the same hole after its last write (`res.end()` with up to 16 KiB still queued); the fix covers it
 * too (not tested: it needs the socket buffers filled to within 16 KiB). After: the connection is closed
 * once its client took nothing for `clientStallMs` (default CLIENT_STALL_MS).
 *
 * A paused socket does not see its peer's close, so the client resumes reading long after the bound: a
 * connection the proxy dropped then ends after what the socket buffers held; one it kept delivers the
 * whole answer and stays open (keep-alive).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(11);
const HELD = { do_remote_prefill: true, remote_engine_id: 'prefill-x', transfer_id: 't', grant: 'g' };
/** Far more than loopback socket buffers take from a client that never read. */
const BIG_TEXT = 'x'.repeat(6 << 20);

async function upstream(answer: string, onSent: () => void = () => {}): Promise<{ url: string; server: Server }> {
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url === '/health') return res.end('{}');
      if (req.url !== '/v1/completions') return res.writeHead(404).end('{}');
      res.on('finish', onSent);
      res.writeHead(200, { 'content-type': 'application/json' }).end(answer);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server };
}

test('a JSON answer its client never reads is dropped by the proxy, not held forever', async () => {
  let decodeSent = false;
  const prefill = await upstream(JSON.stringify({ choices: [{ text: 'x' }], kv_transfer_params: HELD }));
  const answer = JSON.stringify({ choices: [{ index: 0, text: BIG_TEXT, finish_reason: 'length' }] });
  const decode = await upstream(answer, () => (decodeSent = true));
  const urls = { prefillUrls: [prefill.url], decodeUrls: [decode.url] };
  const proxy = new Proxy({ ...DEFAULT_PROXY_OPTIONS, ...urls, healthTimeoutMs: 500, clientStallMs: 300 }, env);
  const port = await proxy.listen(0, '127.0.0.1');
  await proxy.start();
  const sock = connect(port, '127.0.0.1');
  sock.on('error', () => {});
  let closed = false;
  let received = 0;
  sock.on('data', (b: Buffer) => (received += b.length));
  sock.on('close', () => (closed = true));
  try {
    await new Promise<void>((r) => sock.once('connect', () => r()));
    sock.pause(); // reads nothing
    const body = JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 4 });
    sock.write(
      `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n` +
        `content-length: ${body.length}\r\n\r\n${body}`,
    );
    for (let k = 0; k < 1000 && !decodeSent; k++) await env.sleep(10);
    assert.equal(decodeSent, true, 'decode sent its answer to the proxy');
    await env.sleep(2000); // the proxy wrote it to the client at once; the client took none of it since
    sock.resume();
    for (let k = 0; k < 300 && !closed; k++) await env.sleep(10);
    assert.equal(closed, true, `the proxy still held the connection and its answer (client got ${received} bytes)`);
    assert.ok(received < answer.length, 'the answer was dropped, not delivered');
  } finally {
    sock.destroy();
    await proxy.close();
    for (const u of [prefill, decode]) {
      u.server.closeAllConnections();
      await new Promise((r) => u.server.close(r));
    }
  }
});
