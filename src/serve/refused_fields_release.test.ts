/**
 * A decode instance that refuses a READ request while validating its fields gives prefill its held pages
 * back at once, as it already did for refusals found later (refused_release.test.ts). A vLLM-style proxy
 * (the README: "prefill with max_tokens 1 and do_remote_decode, then decode with the returned params
 * drives these servers unchanged") asks prefill for max_tokens 1, stream off and no stream_options, and
 * sends decode the client's original body: a max_tokens past decode's max_model_len, a max_tokens of 0,
 * or stream_options without stream pass prefill and are refused by decode's validateApiRequest. That
 * refusal was thrown before generateFrom's release, so prefill held the pages for the whole lease (60 s)
 * for a request that would never read them: a client repeating it pinned prefill's pool.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance, type InstanceOptions } from './instance.ts';

const env = new RealEnv(33);
let p: Instance;
let d: Instance;

function opts(role: InstanceOptions['role']): InstanceOptions {
  return { ...DEFAULT_INSTANCE_OPTIONS, role, port: 0, numBlocks: 96, scheduler: { maxModelLen: 512 } };
}

before(async () => {
  [p, d] = await Promise.all([startInstance(opts('prefill'), env), startInstance(opts('decode'), env)]);
});

after(async () => {
  await Promise.all([p, d].map((i) => i.close()));
});

async function post(target: Instance, body: Record<string, unknown>): Promise<{ status: number; json: any }> {
  const r = await fetch(`${target.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(60_000),
  });
  return { status: r.status, json: await r.json() };
}

const held = (): number => p.engine.scheduler.numHeldForSend;

async function prefillHoldsAtMost(n: number, what: string, boundMs = 5000): Promise<void> {
  const deadline = env.nowMs() + boundMs;
  while (held() > n) {
    if (env.nowMs() > deadline) assert.fail(`${what}: prefill still holds ${held()} request(s) after ${boundMs} ms`);
    await env.sleep(20);
  }
}

const prompt = Array.from({ length: 70 }, (_, i) => 300 + i);

/** What a vLLM-style proxy does with the client's body (vLLM's toy_proxy_server.py). */
function prefillBodyOf(body: Record<string, unknown>, transferId: string): Record<string, unknown> {
  const out: Record<string, unknown> = { ...body, stream: false, max_tokens: 1 };
  delete out['stream_options'];
  out['kv_transfer_params'] = { do_remote_decode: true, do_remote_prefill: false, transfer_id: transferId };
  return out;
}

const refusedByDecodeOnly: Array<[string, Record<string, unknown>]> = [
  ['max_tokens past the model length', { max_tokens: 600 }],
  ['max_tokens 0', { max_tokens: 0 }],
  ['stream_options without stream', { max_tokens: 4, stream_options: { include_usage: true } }],
];

for (const [what, extra] of refusedByDecodeOnly) {
  test(`decode refuses a field (${what}) that prefill never saw: prefill's pages come back at once, not at the lease`, async () => {
    const before = held();
    const client = { prompt, temperature: 0, ...extra };
    const pre = await post(p, prefillBodyOf(client, `refused-${what.replace(/\W+/g, '-')}`));
    assert.equal(pre.status, 200, JSON.stringify(pre.json));
    assert.equal(held(), before + 1, 'prefill holds its pages for decode');
    const params = { ...pre.json.kv_transfer_params, do_remote_prefill: true, do_remote_decode: false };
    const r = await post(d, { ...client, kv_transfer_params: params });
    assert.equal(r.status, 400, JSON.stringify(r.json));
    assert.equal(r.json.error.code, 'BAD_REQUEST');
    await prefillHoldsAtMost(before, `after decode refused ${what}`);
  });
}
