/**
 * handoff_proxy_requests_total{outcome} for a non-streamed answer its client never reads. The proxy
 * writes decode's JSON answer with one res.end() and, before the fix, counted the completion `ok` right
 * there; the answer then sat queued behind the client's full TCP window until dropIfUnsent closed the
 * connection (clientStallMs later): the client never got its answer, yet the metrics said `ok`. (A
 * streamed answer whose client stops reading is counted `client_abort`: the relay sees the stall.)
 *
 * Before the fix: outcomes {"ok":1}. After: the outcome is counted once the answer left (finished: `ok`)
 * or its connection closed first (`client_abort`), so {"client_abort":1}; a client that reads gets `ok`.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(13);
const HELD = { do_remote_prefill: true, remote_engine_id: 'prefill-x', transfer_id: 't', grant: 'g' };
/** Far more than loopback socket buffers take from a client that never reads. */
const BIG_TEXT = 'x'.repeat(6 << 20);

async function upstream(answer: string): Promise<{ url: string; server: Server }> {
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url === '/health') return res.end('{}');
      if (req.url !== '/v1/completions') return res.writeHead(404).end('{}');
      res.writeHead(200, { 'content-type': 'application/json' }).end(answer);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server };
}

async function outcomes(port: number): Promise<Record<string, number>> {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^handoff_proxy_requests_total\{outcome="([^"]+)"\} (\d+)$/gm))
    out[m[1] as string] = Number(m[2]);
  return out;
}

test('a JSON answer its client never reads (dropped unsent) is not counted ok', async () => {
  const prefill = await upstream(JSON.stringify({ choices: [{ text: 'x' }], kv_transfer_params: HELD }));
  const answer = JSON.stringify({ choices: [{ index: 0, text: BIG_TEXT, finish_reason: 'length' }] });
  const decode = await upstream(answer);
  const urls = { prefillUrls: [prefill.url], decodeUrls: [decode.url] };
  const proxy = new Proxy({ ...DEFAULT_PROXY_OPTIONS, ...urls, healthTimeoutMs: 500, clientStallMs: 300 }, env);
  const port = await proxy.listen(0, '127.0.0.1');
  await proxy.start();
  const sock = connect(port, '127.0.0.1');
  sock.on('error', () => {});
  let closed = false;
  sock.on('close', () => (closed = true));
  try {
    await new Promise<void>((r) => sock.once('connect', () => r()));
    sock.pause(); // reads nothing
    const body = JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 4 });
    sock.write(
      `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n` +
        `content-length: ${body.length}\r\n\r\n${body}`,
    );
    // The proxy drops the connection once the client took nothing for clientStallMs, and counts the
    // outcome then (waited for: a loaded machine takes seconds to move 6 MiB through the proxy). A paused
    // socket sees the close only once resumed.
    let seen = await outcomes(port);
    for (let k = 0; k < 600 && Object.keys(seen).length === 0; k++) {
      await env.sleep(50);
      seen = await outcomes(port);
    }
    sock.resume();
    for (let k = 0; k < 1000 && !closed; k++) await env.sleep(10);
    assert.equal(closed, true, 'the proxy dropped the unread answer');
    assert.deepEqual(seen, { client_abort: 1 }, `outcomes: ${JSON.stringify(seen)}`);

    // A client that reads its answer: ok.
    const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body,
    });
    assert.equal(r.status, 200);
    assert.equal((await r.text()).length, answer.length);
    assert.deepEqual(await outcomes(port), { client_abort: 1, ok: 1 });
  } finally {
    sock.destroy();
    await proxy.close();
    for (const u of [prefill, decode]) {
      u.server.closeAllConnections();
      await new Promise((r) => u.server.close(r));
    }
  }
});
