/**
 * The proxy forwards the client's X-Request-Id as the upstream request id, and cancels a READ
 * prefill leg in band by that id (POST /handoff/cancel {request_id}). Two clients that send the same
 * X-Request-Id (a malicious one copying it, or two that draw the same id) share that id on prefill, so
 * client B leaving cancels client A's request: A gets REQUEST_ABORTED though it never left.
 *
 * Deterministic: prefill's pool is mostly held (a request whose pages wait for a decode), so A waits on
 * prefill for pages; B's prefill leg reaching prefill is the moment B leaves. Then the held pages are
 * released and A must run to its end.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import type { IncomingMessage } from 'node:http';
import type { Server, ServerResponse } from 'node:http';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance, type InstanceOptions } from './instance.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(31);
const closers: Array<() => Promise<unknown>> = [];
after(async () => {
  for (const c of closers.reverse()) await c();
});

function opts(role: InstanceOptions['role'], numBlocks: number): InstanceOptions {
  return { ...DEFAULT_INSTANCE_OPTIONS, role, port: 0, numBlocks, scheduler: { maxModelLen: 256 } };
}

async function metric(i: Instance, name: string): Promise<number> {
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'm').exec((await i.server.metrics.text()).body);
  return Number(m?.[1] ?? 0);
}

const tokens = (n: number, k: number): number[] => Array.from({ length: n }, (_, i) => 100 + ((i * 17 + k) % 2000));

async function proxied(p: Instance, d: Instance): Promise<{ url: string; headers: Record<string, string> }> {
  const proxy = new Proxy(
    { ...DEFAULT_PROXY_OPTIONS, prefillUrls: [p.url], decodeUrls: [d.url], mode: 'read', healthTimeoutMs: 2000 },
    env,
  );
  closers.push(() => proxy.close());
  const port = await proxy.listen(0, '127.0.0.1');
  await proxy.start();
  return { url: `http://127.0.0.1:${port}/v1/completions`, headers: {} };
}

/** llm-d's protocol: decode prefills on the prefiller its header names (sidecar.ts). */
async function sidecar(p: Instance, d: Instance): Promise<{ url: string; headers: Record<string, string> }> {
  return { url: `${d.url}/v1/completions`, headers: { 'x-prefiller-host-port': new URL(p.url).host } };
}

for (const [name, entry] of [
  ['the proxy', proxied],
  ["llm-d's sidecar protocol", sidecar],
] as const)
  test(`a client reusing another client's X-Request-Id through ${name} cannot cancel that client's request`, async () => {
    const [p, d] = await Promise.all([startInstance(opts('prefill', 34), env), startInstance(opts('decode', 96), env)]);
    closers.push(
      () => p.close(),
      () => d.close(),
    );
    const { url, headers: extra } = await entry(p, d);

    // Prefill holds 20 of its 33 pages for a decode that has not come yet.
    const fill = await fetch(`${p.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: tokens(160, 1), max_tokens: 1, kv_transfer_params: { do_remote_decode: true } }),
    });
    assert.equal(fill.status, 200);
    const held = ((await fill.json()) as { kv_transfer_params: Record<string, unknown> }).kv_transfer_params;

    // Client A (X-Request-Id 'order-42'): its prefill leg waits on prefill for pages.
    const a = fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': 'order-42', ...extra },
      body: JSON.stringify({ prompt: tokens(110, 2), max_tokens: 4, temperature: 0 }),
      signal: AbortSignal.timeout(60_000),
    }).then(async (r) => ({ status: r.status, text: await r.text() }));
    for (let k = 0; k < 500 && (await metric(p, 'handoff_num_requests_waiting')) < 1; k++) await env.sleep(10);
    assert.equal(await metric(p, 'handoff_num_requests_waiting'), 1, 'A waits on prefill');

    // Client B sends the same X-Request-Id and leaves once its prefill leg reached prefill.
    const bLeaves = new AbortController();
    const http = (p.server as unknown as { server: Server }).server;
    // B's leg is handed to prefill's handler only after the proxy had time to act on B leaving.
    const [serve] = http.listeners('request') as Array<(req: IncomingMessage, res: ServerResponse) => void>;
    http.removeAllListeners('request');
    const cancels: string[] = [];
    http.on('request', (req: IncomingMessage, res: ServerResponse) => {
      if (req.url === '/handoff/cancel') cancels.push(String(req.headers['x-request-id']));
      if (req.url === '/v1/completions' && String(req.headers['x-request-id']).startsWith('order-42')) {
        bLeaves.abort();
        setTimeout(() => serve!(req, res), 500);
        return;
      }
      serve!(req, res);
    });
    const b = fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': 'order-42', ...extra },
      body: JSON.stringify({ prompt: tokens(20, 3), max_tokens: 4 }),
      signal: bLeaves.signal,
    }).catch(() => 'left');
    assert.equal(await b, 'left');
    await env.sleep(500); // the proxy's in-band cancel of B's leg reaches prefill

    // The held pages come back: A can run.
    const rel = await fetch(`${d.url}/handoff/release`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ kv_transfer_params: { ...held, do_remote_prefill: true, do_remote_decode: false } }),
    });
    assert.equal(rel.status, 200);
    const got = await a;
    assert.equal(got.status, 200, `client A's request was cancelled by client B (cancels: ${cancels}): ${got.text}`);
  });
