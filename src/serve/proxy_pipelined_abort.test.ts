/**
 * A client that pipelines completions on one keep-alive connection and then closes it aborts every one of
 * them at the proxy, not only the first: the legs to prefill and decode are dropped (the instances then
 * abort their requests and free the pages).
 *
 * A response queued behind another on its connection has no socket yet: when the connection closes, its
 * own 'close' never comes (response_sinks.ts onResponseGone, which the instance server uses for this).
 * Before the fix the proxy watched only `res.on('close')`: the second pipelined completion ran on for
 * its client long gone, its decode leg streaming into a response nobody could take, until its answer
 * ended or the client stall bound (30 s) cut it. One connection could so start any number of generations
 * that outlive it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server, type ServerResponse } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(17);
const HELD = { do_remote_prefill: true, remote_engine_id: 'prefill-x', transfer_id: 't', grant: 'g' };

async function listen(server: Server): Promise<string> {
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

function fake(completion: (res: ServerResponse) => void): Server {
  return createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url === '/health') return res.end('{}');
      if (req.url !== '/v1/completions') return res.writeHead(404).end('{}');
      completion(res);
    });
  });
}

test('closing a connection with pipelined streaming completions drops every decode leg', async () => {
  const open = new Set<ServerResponse>();
  const prefill = fake((res) => {
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ choices: [{ text: 'x', index: 0 }], kv_transfer_params: HELD }));
  });
  // Decode streams an event every 20 ms and never ends on its own.
  const decode = fake((res) => {
    open.add(res);
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const ev = `data: ${JSON.stringify({ choices: [{ index: 0, text: 'y' }] })}\n\n`;
    const t = setInterval(() => res.write(ev), 20);
    res.on('close', () => (clearInterval(t), open.delete(res)));
  });
  const urls = { prefillUrls: [await listen(prefill)], decodeUrls: [await listen(decode)] };
  const proxy = new Proxy({ ...DEFAULT_PROXY_OPTIONS, ...urls, healthTimeoutMs: 500 }, env);
  const port = await proxy.listen(0, '127.0.0.1');
  await proxy.start();
  const sock = connect(port, '127.0.0.1');
  sock.on('error', () => {});
  try {
    await new Promise<void>((r) => sock.once('connect', () => r()));
    const body = JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 1000, stream: true });
    const one =
      `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n` +
      `content-length: ${body.length}\r\n\r\n${body}`;
    sock.write(one + one);
    for (let k = 0; k < 500 && open.size < 2; k++) await env.sleep(10);
    assert.equal(open.size, 2, 'both pipelined completions reached decode');
    sock.destroy(); // the client goes away
    for (let k = 0; k < 300 && open.size > 0; k++) await env.sleep(10);
    assert.equal(open.size, 0, `${open.size} decode leg(s) still streaming for a client gone 3 s ago`);
    for (let k = 0; k < 100 && proxy.decode.members[0]!.inflight > 0; k++) await env.sleep(10);
    assert.equal(proxy.decode.members[0]!.inflight, 0, 'the proxy still counts a leg in flight');
  } finally {
    sock.destroy();
    await proxy.close();
    for (const s of [prefill, decode]) {
      s.closeAllConnections();
      await new Promise((r) => s.close(r));
    }
  }
});
