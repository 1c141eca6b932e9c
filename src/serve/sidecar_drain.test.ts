/**
 * Draining a decode (SIGTERM) waits for a request on the llm-d sidecar path that is still on its
 * prefiller (it is in neither the engine nor the live answers yet), and that request then runs to its
 * end instead of being refused: here the prefiller is a real prefill instance 800 ms away. The request
 * was dropped with its connection before.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type InstanceOptions } from './instance.ts';

const env = new RealEnv(3);
function opts(role: InstanceOptions['role']): InstanceOptions {
  return { ...DEFAULT_INSTANCE_OPTIONS, role, port: 0, numBlocks: 96, scheduler: { maxModelLen: 512 } };
}

test('SIGTERM drain of a decode waits for an llm-d sidecar request still on its prefiller', async () => {
  const [p, d] = await Promise.all([startInstance(opts('prefill'), env), startInstance(opts('decode'), env)]);
  let prefillerGotIt = false;
  // A slow prefiller: the real prefill instance, 800 ms away.
  const slow = createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      if (req.url === '/v1/completions') prefillerGotIt = true;
      void env
        .sleep(req.url === '/v1/completions' ? 800 : 0)
        .then(async () => {
          const headers: Record<string, string> = { 'content-type': 'application/json' };
          if (typeof req.headers['x-request-id'] === 'string') headers['x-request-id'] = req.headers['x-request-id'];
          const r = await fetch(`${p.url}${req.url}`, { method: req.method, headers, body: body || undefined });
          res.writeHead(r.status, { 'content-type': r.headers.get('content-type') ?? 'application/json' });
          res.end(await r.text());
        })
        .catch(() => res.destroy());
    });
  });
  await new Promise<void>((r) => slow.listen(0, '127.0.0.1', r));
  const prefiller = `127.0.0.1:${(slow.address() as AddressInfo).port}`;
  let drained: Promise<boolean> | null = null;
  try {
    const answer = fetch(`${d.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-prefiller-host-port': prefiller },
      body: JSON.stringify({ prompt: Array.from({ length: 40 }, (_, i) => 300 + i), max_tokens: 4, temperature: 0 }),
    }).then(
      async (r) => ({ status: r.status, text: await r.text() }),
      (e: Error) => ({
        status: -1,
        text: `connection dropped: ${e.message} ${String((e as { cause?: unknown }).cause)}`,
      }),
    );
    for (let k = 0; k < 500 && !prefillerGotIt; k++) await env.sleep(10);
    assert.ok(prefillerGotIt, 'the request is on the prefiller');
    const t0 = env.nowMs();
    drained = d.drainAndClose(30_000); // SIGTERM
    const got = await answer;
    assert.equal(
      got.status,
      200,
      `in-flight request (drain started ${Math.round(env.nowMs() - t0)} ms before): ${got.text}`,
    );
  } finally {
    await (drained ?? d.close()).catch(() => undefined);
    await p.close();
    await new Promise<void>((r) => (slow.closeAllConnections(), slow.close(() => r())));
  }
});
