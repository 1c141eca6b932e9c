/**
 * Proves: a decode the proxy has chosen for a request counts as loaded from that moment, not only once
 * the request's prefill has answered. Before, `least-loaded` (and kv-aware's load term) saw a decode
 * whose requests were all still on prefill as idle, so a burst arriving while one decode was busy all
 * went to the other: four of four here, where least-loaded spreads them two and two.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(47);

type Handler = (req: IncomingMessage, res: ServerResponse) => void;

/** /health 200; completions by `completion`; anything else 404. */
async function fake(completion: Handler): Promise<{ url: string; close(): Promise<void> }> {
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url === '/health') return void res.end('{}');
      if (req.url === '/v1/completions') return completion(req, res);
      res.writeHead(404).end('{}');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise((r) => (server.closeAllConnections(), server.close(() => r()))),
  };
}

const json = (res: ServerResponse, body: unknown): void => {
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify(body));
};
const held = { do_remote_prefill: false, do_remote_decode: true, transfer_id: 't' };
const answer = { choices: [{ text: 'x', index: 0, finish_reason: 'length' }] };

test('least-loaded: decodes chosen for requests still on prefill count as loaded (a burst is spread)', async () => {
  // Prefill takes 400 ms: the burst below is routed while every one of its prefills runs.
  const prefill = await fake(
    (_q, res) => void env.sleep(400).then(() => json(res, { ...answer, kv_transfer_params: held })),
  );
  let first = true;
  const busy = await fake((_q, res) => {
    const wait = first ? 3000 : 0; // its first request keeps it busy while the burst is routed
    first = false;
    void env.sleep(wait).then(() => json(res, answer));
  });
  const idle = await fake((_q, res) => json(res, answer));
  const proxy = new Proxy(
    {
      ...DEFAULT_PROXY_OPTIONS,
      policy: 'least-loaded',
      healthTimeoutMs: 500,
      prefillUrls: [prefill.url],
      decodeUrls: [busy.url, idle.url],
    },
    env,
  );
  const url = `http://127.0.0.1:${await proxy.listen(0, '127.0.0.1')}`;
  await proxy.start();
  const post = (): Promise<number> =>
    fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 4 }),
    }).then(async (r) => (await r.text(), r.status));
  try {
    const [busyM, idleM] = proxy.decode.members as [(typeof proxy.decode.members)[0], (typeof proxy.decode.members)[0]];
    const long = post();
    for (let i = 0; i < 100 && busyM.served === 0; i++) await env.sleep(20);
    assert.equal(busyM.served, 1, 'the first request is on the busy decode');
    const burst = await Promise.all([post(), post(), post(), post()]);
    assert.deepEqual(burst, [200, 200, 200, 200]);
    assert.equal(await long, 200);
    assert.deepEqual(
      { busy: busyM.served - 1, idle: idleM.served },
      { busy: 2, idle: 2 },
      'the burst is spread by load, not all sent to the decode that looked idle',
    );
  } finally {
    await proxy.close();
    await Promise.all([prefill, busy, idle].map((f) => f.close()));
  }
});
