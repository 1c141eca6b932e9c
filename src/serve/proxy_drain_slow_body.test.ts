/**
 * The proxy's SIGTERM drain does not wait for a client still trickling its request body (slowloris), and
 * that request is refused (503 OVERLOADED) once its body is in, as one arriving after the drain began.
 *
 * Before the fix the completion gate counted a completion from its first byte: one client sending its
 * body a byte at a time (Node's requestTimeout lets it for 300 s) held the drain for its whole timeout
 * (PROXY_DRAIN_MS), and its request, admitted before the drain by its headers alone, was then served in
 * full, delaying every shutdown as long as that client liked.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(37);

test('a proxy drain is not held by a body still arriving, and that request is refused', async () => {
  const up = createServer((req, res) => {
    req.resume();
    req.on('end', () => (req.url === '/health' ? res.end('{}') : res.writeHead(404).end('{}')));
  });
  await new Promise<void>((r) => up.listen(0, '127.0.0.1', r));
  const upUrl = `http://127.0.0.1:${(up.address() as AddressInfo).port}`;
  const urls = { prefillUrls: [upUrl], decodeUrls: [upUrl] };
  const proxy = new Proxy({ ...DEFAULT_PROXY_OPTIONS, ...urls, healthTimeoutMs: 500 }, env);
  const port = await proxy.listen(0, '127.0.0.1');
  await proxy.start();
  const body = JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 4 });
  const sock = connect(port, '127.0.0.1');
  sock.on('error', () => {});
  let answer = '';
  sock.on('data', (b: Buffer) => (answer += b.toString()));
  try {
    await new Promise<void>((r) => sock.once('connect', () => r()));
    sock.write(
      `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n` +
        `content-length: ${body.length}\r\n\r\n${body.slice(0, 5)}`,
    );
    await env.sleep(200); // the proxy has the headers and the first bytes
    assert.equal(await proxy.drain(2000), true, 'the drain waited its whole timeout for a body still arriving');
    sock.write(body.slice(5));
    for (let k = 0; k < 300 && !answer.includes('\r\n\r\n'); k++) await env.sleep(10);
    assert.match(answer, /^HTTP\/1\.1 503 /, `the late request is refused: ${answer.slice(0, 300)}`);
    assert.match(answer, /"code":"OVERLOADED"/);
  } finally {
    sock.destroy();
    await proxy.close();
    up.closeAllConnections();
    await new Promise((r) => up.close(r));
  }
});
