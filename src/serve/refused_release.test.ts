/**
 * A decode instance that refuses a READ request before it reaches the engine gives
 * prefill its held pages back at once (vLLM #50425), whatever the refusal. Before the fix only a client
 * gone during tokenization (or a draining server) released them; a refusal found while preparing the
 * request (PROMPT_TOO_LONG once the prompt is tokenized, an unknown model name, the tokenizer overloaded)
 * left prefill's pages held for a request that would never read them, for the whole lease (60 s): a
 * client repeating such a request pinned prefill's pool and starved every other client's prefills.
 * Shown through llm-d's sidecar protocol (decode checks max_tokens against the tokenized prompt only
 * after prefill answered) and through a proxy that sends decode a model name it does not serve.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance, type InstanceOptions } from './instance.ts';

const env = new RealEnv(31);
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

async function post(
  target: Instance,
  body: Record<string, unknown>,
  headers: Record<string, string> = {},
): Promise<{ status: number; json: Record<string, unknown> }> {
  const r = await fetch(`${target.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(60_000),
  });
  return { status: r.status, json: (await r.json()) as Record<string, unknown> };
}

const held = (): number => p.engine.scheduler.numHeldForSend;

/** Poll until prefill holds at most `n` requests for a peer; a liveness bound far below the 60 s lease. */
async function prefillHoldsAtMost(n: number, what: string, boundMs = 5000): Promise<void> {
  const deadline = env.nowMs() + boundMs;
  while (held() > n) {
    if (env.nowMs() > deadline) assert.fail(`${what}: prefill still holds ${held()} request(s) after ${boundMs} ms`);
    await env.sleep(20);
  }
}

const prompt = Array.from({ length: 70 }, (_, i) => 300 + i);
const code = (j: Record<string, unknown>): string => (j['error'] as { code: string }).code;

test('sidecar: decode refuses prompt + max_tokens past its length after prefill answered; prefill pages come back', async () => {
  const before = held();
  // 70 + 500 > 512: prefill (asked for 1 token) computes it; decode refuses it once it knows the token count.
  const r = await post(
    d,
    { prompt, max_tokens: 500, temperature: 0 },
    { 'x-prefiller-host-port': new URL(p.url).host },
  );
  assert.equal(r.status, 400, JSON.stringify(r.json));
  assert.equal(code(r.json), 'PROMPT_TOO_LONG');
  await prefillHoldsAtMost(before, 'after the refused sidecar request');
});

test('decode refuses a model it does not serve after prefill answered; prefill pages come back', async () => {
  const before = held();
  const pre = await post(p, {
    prompt,
    max_tokens: 1,
    temperature: 0,
    kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, transfer_id: 'refused-model' },
  });
  assert.equal(pre.status, 200, JSON.stringify(pre.json));
  assert.equal(held(), before + 1, 'prefill holds its pages for decode');
  const params = { ...(pre.json['kv_transfer_params'] as object), do_remote_prefill: true, do_remote_decode: false };
  const r = await post(d, { model: 'not-served', prompt, max_tokens: 4, temperature: 0, kv_transfer_params: params });
  assert.equal(r.status, 404, JSON.stringify(r.json));
  await prefillHoldsAtMost(before, 'after the refused model');
  // Decode still serves a good request from the same prefill.
  const ok = await post(d, { prompt, max_tokens: 4, temperature: 0 }, { 'x-prefiller-host-port': new URL(p.url).host });
  assert.equal(ok.status, 200, JSON.stringify(ok.json));
  await prefillHoldsAtMost(before, 'after a served request');
});
