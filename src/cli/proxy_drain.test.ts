/**
 * SIGTERM of `handoff proxy` (and of `handoff up`, whose proxy stops the same way) while a completion is
 * under way: the proxy closed every connection at once, so the client got a connection reset (no answer,
 * no error) although the decode instance behind it was still producing the answer, and the instances
 * themselves drain on SIGTERM. Found by stopping `up` in the middle of a soak: 8 requests in flight, 8
 * `UND_ERR_SOCKET`. This proves the drain: the completion under way is answered (200, decode's body),
 * a new one meanwhile gets a 503 OVERLOADED OpenAI error, and the proxy then exits 0. The upstreams are
 * plain HTTP servers (no /handoff/info, like vLLM's): decode answers only when the test says so.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { spawnHandoff } from './children.ts';

const env = new RealEnv(11);
const HELD = { do_remote_prefill: true, remote_engine_id: 'prefill-x', transfer_id: 't', grant: 'g' };
const ANSWER = {
  id: 'cmpl-1',
  object: 'text_completion',
  choices: [{ index: 0, text: 'done', finish_reason: 'length' }],
};

/** Prefill answers at once; decode's completion waits for `release()`. */
async function upstream(role: 'prefill' | 'decode') {
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  let got!: () => void;
  const received = new Promise<void>((r) => (got = r));
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      const path = req.url ?? '';
      if (path === '/health') return res.end('{}');
      if (path !== '/v1/completions') {
        res.statusCode = path === '/handoff/info' ? 404 : 200;
        return res.end('{}');
      }
      res.setHeader('content-type', 'application/json');
      if (role === 'prefill') return res.end(JSON.stringify({ ...ANSWER, kv_transfer_params: HELD }));
      got();
      void released.then(() => res.end(JSON.stringify(ANSWER)));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    received,
    release,
    close: () => new Promise<void>((r) => (server.closeAllConnections(), server.close(() => r()))),
  };
}

const complete = (url: string): Promise<Response> =>
  fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', prompt: 'hello', max_tokens: 4 }),
  });

test('SIGTERM of the proxy: the completion under way is answered, a new one gets 503 OVERLOADED, exit 0', async () => {
  const [prefill, decode] = await Promise.all([upstream('prefill'), upstream('decode')]);
  const proxy = await spawnHandoff(['proxy', '--prefill', prefill.url, '--decode', decode.url, '--port', '0'], env);
  try {
    const exited = new Promise<number | null>((r) => proxy.child.once('exit', (code) => r(code)));
    const underWay = complete(proxy.url).then(
      async (r) => ({ status: r.status, body: (await r.json()) as typeof ANSWER }),
      (e: unknown) => ({ status: -1, body: String((e as Error).cause ?? e) }),
    );
    await decode.received;
    proxy.child.kill('SIGTERM');
    await env.sleep(500);
    const late = await complete(proxy.url).then(
      async (r) => ({ status: r.status, code: ((await r.json()) as { error?: { code?: string } }).error?.code }),
      (e: unknown) => ({ status: -1, code: String((e as Error).cause ?? e) }),
    );
    assert.equal(late.status, 503, `a new completion while draining: ${late.code}`);
    assert.equal(late.code, 'OVERLOADED');
    decode.release();
    const answered = await underWay;
    assert.equal(
      answered.status,
      200,
      `the completion under way is answered, not cut: ${JSON.stringify(answered.body)}`,
    );
    assert.deepEqual(answered.body, ANSWER);
    assert.equal(await exited, 0);
  } finally {
    await proxy.stop(1000);
    await Promise.all([prefill.close(), decode.close()]);
  }
});
