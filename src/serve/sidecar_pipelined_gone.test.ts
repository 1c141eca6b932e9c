/**
 * llm-d's sidecar path on a decode instance, for a completion pipelined on a keep-alive connection behind
 * a response that never ends (the client's own KV event stream), whose client closes the connection
 * while the prefiller computes: the request must not stay live once it is over.
 *
 * A response queued behind another gets no 'close' of its own when its connection closes: the sidecar
 * watched `res.on('close')` only, so the prefill leg ran on, and decode's generation was registered
 * with onResponseGone (response_sinks.ts) after the connection had closed, so it never heard of it.
 * Before the fix the request stayed in the server's live set for the life of the process (numLive 1
 * forever, every SIGTERM drain waiting its whole timeout for it). After: the request is dropped once
 * its connection is gone, whenever that happened.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { smallInstances } from './small_instances_testkit.ts';

const env = new RealEnv(29);
const start = smallInstances(env);

test('a pipelined sidecar completion whose client left during the prefill leg does not stay live', async () => {
  const p = await start({ role: 'prefill' });
  const d = await start({ role: 'decode' });
  // The prefiller, slowed down: it forwards to the real prefill instance after 800 ms.
  let asked = false;
  const slow = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (b: Buffer) => parts.push(b));
    req.on('end', () => {
      if (req.url !== '/v1/completions') return res.writeHead(404).end('{}');
      asked = true;
      void env.sleep(800).then(async () => {
        const r = await fetch(`${p.url}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-request-id': String(req.headers['x-request-id']) },
          body: Buffer.concat(parts),
        });
        res.writeHead(r.status, { 'content-type': 'application/json' }).end(await r.text());
      });
    });
  });
  await new Promise<void>((r) => slow.listen(0, '127.0.0.1', r));
  after(() => new Promise<void>((r) => (slow.closeAllConnections(), slow.close(() => r()))));
  const prefiller = `127.0.0.1:${(slow.address() as AddressInfo).port}`;
  const url = new URL(d.url);
  const body = JSON.stringify({ prompt: [1, 2, 3, 4, 5, 6, 7, 8], max_tokens: 4, temperature: 0 });
  const sock = connect(Number(url.port), url.hostname);
  sock.on('error', () => {});
  sock.write(
    `GET /handoff/kv_events HTTP/1.1\r\nHost: x\r\n\r\n` +
      `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
      `x-prefiller-host-port: ${prefiller}\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
  );
  for (let k = 0; k < 500 && !asked; k++) await env.sleep(10);
  assert.equal(asked, true, 'decode asked the prefiller');
  sock.destroy(); // the client goes away while the prefiller computes
  await env.sleep(1500); // the prefiller answered 1 s ago at most
  for (let k = 0; k < 300 && d.server.numLive > 0; k++) await env.sleep(10);
  assert.equal(d.server.numLive, 0, 'the request of a client long gone is still live');
  assert.equal(await d.server.drain(2000), true, 'a drain waits for it');
});
