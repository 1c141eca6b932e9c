/**
 * READ mode, the client leaving while prefill computes: the proxy tells prefill in band (POST
 * /handoff/cancel with the request id) and keeps its connection, so an answer prefill had already sent
 * still arrives, and the pages it holds are released through decode at once (POST /handoff/release)
 * instead of waiting for the lease. Dropping the connection instead lost such an answer, and with it
 * the only way to release those pages before the lease (found by `soak --abort-rate`). A prefiller
 * without the route (vLLM), or that takes the cancel but never answers, has its connection dropped, as
 * before (the latter after CANCELLED_ANSWER_MS). The upstreams here are plain HTTP
 * servers that record what the proxy does.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  createServer,
  request as httpRequest,
  type ClientRequest,
  type IncomingMessage,
  type ServerResponse,
} from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';
import { CANCELLED_ANSWER_MS } from './upstream.ts';

const env = new RealEnv(5);
const HELD = { do_remote_prefill: true, remote_engine_id: 'prefill-x', transfer_id: 't', grant: 'g' };

interface Fake {
  url: string;
  seen: Array<{ path: string; id: string | undefined; body: string }>;
  /** The completion the proxy sent (answer it with `answer`), and whether the proxy dropped it first. */
  completion: Promise<{ answer(body: unknown): void; dropped(): boolean }>;
  close(): Promise<void>;
}

async function fake(cancelStatus = 200): Promise<Fake> {
  const seen: Fake['seen'] = [];
  let took!: (c: { answer(body: unknown): void; dropped(): boolean }) => void;
  const completion = new Promise<{ answer(body: unknown): void; dropped(): boolean }>((r) => (took = r));
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      const path = req.url ?? '';
      seen.push({ path, id: req.headers['x-request-id'] as string | undefined, body });
      if (path === '/health') return res.end('{}');
      if (path !== '/v1/completions') {
        res.statusCode = path === '/handoff/info' ? 404 : path === '/handoff/cancel' ? cancelStatus : 200;
        return res.end('{}');
      }
      let gone = false;
      res.on('close', () => (gone = !res.writableFinished));
      took({
        answer: (b) => res.end(JSON.stringify(b)),
        dropped: () => gone,
      });
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url,
    seen,
    completion,
    close: () => new Promise((r) => (server.closeAllConnections(), server.close(() => r()))),
  };
}

/** A proxy over `prefill` and `decode`, and a client whose request it is sending to prefill now. */
async function leaving(prefill: Fake, decode: Fake): Promise<{ proxy: Proxy; client: ClientRequest }> {
  const proxy = new Proxy(
    { ...DEFAULT_PROXY_OPTIONS, prefillUrls: [prefill.url], decodeUrls: [decode.url], healthTimeoutMs: 500 },
    env,
  );
  const port = await proxy.listen(0, '127.0.0.1');
  await proxy.start();
  const client = httpRequest({
    host: '127.0.0.1',
    port,
    method: 'POST',
    path: '/v1/completions',
    headers: { 'content-type': 'application/json', 'x-request-id': 'client-1' },
  });
  client.on('error', () => {});
  client.end(JSON.stringify({ model: 'm', prompt: 'hello there', max_tokens: 4 }));
  return { proxy, client };
}

test('READ: a client leaving during prefill cancels it in band; an answer already sent is read and its pages released through decode', async () => {
  const [prefill, decode] = await Promise.all([fake(), fake()]);
  const { proxy, client } = await leaving(prefill, decode);
  try {
    const c = await prefill.completion;
    client.destroy(); // the client leaves while prefill computes
    for (let k = 0; k < 200 && !prefill.seen.some((s) => s.path === '/handoff/cancel'); k++) await env.sleep(5);
    const cancel = prefill.seen.find((s) => s.path === '/handoff/cancel');
    assert.ok(cancel, 'prefill was told in band');
    assert.match((JSON.parse(cancel.body) as { request_id: string }).request_id, /^client-1\.[0-9a-f]{16}$/);
    assert.equal((JSON.parse(cancel.body) as { request_id: string }).request_id, cancel.id, "the leg's own id");
    assert.equal(c.dropped(), false, 'the proxy kept the connection: an answer on its way still arrives');
    c.answer({ choices: [{ text: 'x', index: 0, finish_reason: 'length' }], kv_transfer_params: HELD });
    for (let k = 0; k < 200 && !decode.seen.some((s) => s.path === '/handoff/release'); k++) await env.sleep(5);
    const release = decode.seen.find((s) => s.path === '/handoff/release');
    assert.ok(release, 'the held pages are released through decode, not left to the lease');
    assert.equal(JSON.parse(release.body).kv_transfer_params.grant, 'g');
    assert.equal(decode.seen.filter((s) => s.path === '/v1/completions').length, 0, 'decode never ran it');
  } finally {
    await proxy.close();
    await Promise.all([prefill.close(), decode.close()]);
  }
});

test('READ: a prefiller that has no /handoff/cancel (vLLM) has its connection dropped, as before', async () => {
  const [prefill, decode] = await Promise.all([fake(404), fake()]);
  const { proxy, client } = await leaving(prefill, decode);
  try {
    const c = await prefill.completion;
    client.destroy();
    for (let k = 0; k < 200 && !c.dropped(); k++) await env.sleep(5);
    assert.ok(
      prefill.seen.some((s) => s.path === '/handoff/cancel'),
      'it was asked first',
    );
    assert.equal(c.dropped(), true, 'then the connection was dropped');
  } finally {
    await proxy.close();
    await Promise.all([prefill.close(), decode.close()]);
  }
});

test('READ: a prefiller that takes the cancel but never answers has its connection dropped after CANCELLED_ANSWER_MS', async () => {
  const [prefill, decode] = await Promise.all([fake(), fake()]);
  const { proxy, client } = await leaving(prefill, decode);
  try {
    const c = await prefill.completion;
    client.destroy();
    const t0 = env.nowMs();
    for (let k = 0; k < 200 && !prefill.seen.some((s) => s.path === '/handoff/cancel'); k++) await env.sleep(5);
    await env.sleep(CANCELLED_ANSWER_MS / 2);
    assert.equal(c.dropped(), false, 'kept while the answer may still come');
    for (let k = 0; k < 1000 && !c.dropped(); k++) await env.sleep(10);
    assert.equal(c.dropped(), true);
    assert.ok(env.nowMs() - t0 >= CANCELLED_ANSWER_MS, 'not before the bound');
  } finally {
    await proxy.close();
    await Promise.all([prefill.close(), decode.close()]);
  }
});
