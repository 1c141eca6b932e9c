/**
 * READ mode, the client leaving while prefill computes, and prefill too busy to answer the in-band cancel
 * within its bound (healthTimeoutMs): the proxy dropped prefill's connection at once, so an answer prefill
 * had already sent was lost with the params of the pages it holds, which then waited for the 60 s lease
 * (`soak --prefill-tp 2 --abort-rate 0.3` on a loaded machine: "in-band cancel failed", then
 * handoff_leases_expired_total 1 on prefill). This proves that a cancel that timed out is treated like
 * one taken: the connection is kept (up to CANCELLED_ANSWER_MS), the late answer is read and its pages
 * released through decode. A cancel refused outright still drops the connection (proxy_cancel.test.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(5);
const HELD = { do_remote_prefill: true, remote_engine_id: 'prefill-x', transfer_id: 't', grant: 'g' };
const HEALTH_TIMEOUT_MS = 300;

/** An upstream that records requests; `/handoff/cancel` is never answered when `hangCancel`. */
async function fake(hangCancel: boolean) {
  const seen: Array<{ path: string; body: string }> = [];
  const hung: ServerResponse[] = [];
  let took!: (c: { answer(body: unknown): void; dropped(): boolean }) => void;
  const completion = new Promise<{ answer(body: unknown): void; dropped(): boolean }>((r) => (took = r));
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      const path = req.url ?? '';
      seen.push({ path, body });
      if (path === '/handoff/cancel' && hangCancel) return void hung.push(res);
      if (path !== '/v1/completions') {
        res.statusCode = path === '/handoff/info' ? 404 : 200;
        return res.end('{}');
      }
      let gone = false;
      res.on('close', () => (gone = !res.writableFinished));
      took({ answer: (b) => res.end(JSON.stringify(b)), dropped: () => gone });
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    seen,
    completion,
    close: () => new Promise<void>((r) => (server.closeAllConnections(), server.close(() => r()))),
  };
}

test('READ: a cancel prefill does not answer in time keeps the connection; the late answer is released through decode', async () => {
  const [prefill, decode] = await Promise.all([fake(true), fake(false)]);
  const proxy = new Proxy(
    {
      ...DEFAULT_PROXY_OPTIONS,
      prefillUrls: [prefill.url],
      decodeUrls: [decode.url],
      healthTimeoutMs: HEALTH_TIMEOUT_MS,
    },
    env,
  );
  try {
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
    const c = await prefill.completion;
    client.destroy(); // the client leaves while prefill computes
    for (let k = 0; k < 200 && !prefill.seen.some((s) => s.path === '/handoff/cancel'); k++) await env.sleep(5);
    assert.ok(
      prefill.seen.some((s) => s.path === '/handoff/cancel'),
      'prefill was told in band',
    );
    // The cancel's bound passes with no answer (a busy prefiller); wait well past it.
    await env.sleep(HEALTH_TIMEOUT_MS * 3);
    assert.equal(c.dropped(), false, 'the connection is kept: the answer may still come');
    c.answer({ choices: [{ text: 'x', index: 0, finish_reason: 'length' }], kv_transfer_params: HELD });
    for (let k = 0; k < 200 && !decode.seen.some((s) => s.path === '/handoff/release'); k++) await env.sleep(5);
    const release = decode.seen.find((s) => s.path === '/handoff/release');
    assert.ok(release, 'the held pages are released through decode, not left to the lease');
    assert.equal((JSON.parse(release.body) as { kv_transfer_params: { grant: string } }).kv_transfer_params.grant, 'g');
  } finally {
    await proxy.close();
    await Promise.all([prefill.close(), decode.close()]);
  }
});
