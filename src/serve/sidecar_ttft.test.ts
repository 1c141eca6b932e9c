/**
 * A request driven by llm-d's sidecar protocol (x-prefiller-host-port) arrives at the decode instance,
 * which runs the prefill leg and then the decode itself: the client waits for both. Decode's
 * handoff_time_to_first_token_seconds and handoff_e2e_request_latency_seconds were measured from the
 * start of the decode leg, so a prefill leg that took 600 ms did not show in them at all. Here the
 * prefiller answers through a front that waits 600 ms: decode's TTFT and e2e must include that wait.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance, type InstanceOptions } from './instance.ts';

const env = new RealEnv(41);
const DELAY_MS = 600;
const opened: Instance[] = [];
let front: Server | null = null;

after(async () => {
  await Promise.all(opened.map((i) => i.close()));
  front?.closeAllConnections();
  await new Promise((r) => (front ? front.close(() => r(null)) : r(null)));
});

function opts(role: InstanceOptions['role']): InstanceOptions {
  return { ...DEFAULT_INSTANCE_OPTIONS, role, port: 0, numBlocks: 64, scheduler: { maxModelLen: 256 } };
}

/** An HTTP front of the prefiller that forwards each request after DELAY_MS (a slow prefill leg). */
async function slowFront(target: string): Promise<string> {
  front = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      void env.sleep(DELAY_MS).then(async () => {
        const headers: Record<string, string> = { 'content-type': 'application/json' };
        const id = req.headers['x-request-id'];
        if (typeof id === 'string') headers['x-request-id'] = id;
        const r = await fetch(`${target}${req.url ?? '/'}`, {
          method: req.method ?? 'POST',
          headers,
          ...(req.method === 'POST' ? { body: Buffer.concat(chunks) } : {}),
        });
        res.writeHead(r.status, { 'content-type': r.headers.get('content-type') ?? 'application/json' });
        res.end(Buffer.from(await r.arrayBuffer()));
      });
    });
  });
  await new Promise<void>((r) => front?.listen(0, '127.0.0.1', r));
  return `127.0.0.1:${(front.address() as AddressInfo).port}`;
}

function sumOf(text: string, name: string): number {
  const m = new RegExp(`^${name}_sum(?:\\{[^}]*\\})? (\\S+)$`, 'm').exec(text);
  return Number(m?.[1] ?? NaN);
}

test('sidecar: decode TTFT and e2e include the prefill leg the client waited for', async () => {
  const [p, d] = await Promise.all([startInstance(opts('prefill'), env), startInstance(opts('decode'), env)]);
  opened.push(p, d);
  const prefiller = await slowFront(p.url);
  const r = await fetch(`${d.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-prefiller-host-port': prefiller },
    body: JSON.stringify({ prompt: 'a prompt prefilled elsewhere', max_tokens: 2, temperature: 0 }),
    signal: AbortSignal.timeout(60_000),
  });
  assert.equal(r.status, 200, await r.clone().text());
  await r.text();
  const text = (await d.server.metrics.text()).body;
  const ttft = sumOf(text, 'handoff_time_to_first_token_seconds');
  const e2e = sumOf(text, 'handoff_e2e_request_latency_seconds');
  assert.ok(ttft >= DELAY_MS / 1000, `decode TTFT ${ttft} s leaves out the ${DELAY_MS} ms prefill leg`);
  assert.ok(e2e >= DELAY_MS / 1000, `decode e2e ${e2e} s leaves out the ${DELAY_MS} ms prefill leg`);
});
