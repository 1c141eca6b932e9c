/**
 * Decode instances may run different --max-model-len (xPyD pools of different sizes). The proxy refuses
 * what decode would refuse before prefill computes anything, but it checked every request against the
 * smallest decode's limit: a request that the larger decode serves was refused with a 400, by the proxy
 * alone. It must be routed to a decode that takes it (and still refused when no decode does). Prefill
 * instances the same: round robin sent a prompt to a prefill too small for it, whose 400 the client got,
 * though another prefill takes it.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance, type InstanceOptions } from './instance.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(43);
const closers: Array<() => Promise<unknown>> = [];
after(async () => {
  for (const c of closers.reverse()) await c();
});

function opts(role: InstanceOptions['role'], maxModelLen: number): InstanceOptions {
  return { ...DEFAULT_INSTANCE_OPTIONS, role, port: 0, numBlocks: 72, scheduler: { maxModelLen } };
}

async function complete(url: string, body: Record<string, unknown>): Promise<{ status: number; json: any }> {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(30_000),
  });
  return { status: r.status, json: await r.json() };
}

const prompt = (n: number): number[] => Array.from({ length: n }, (_, i) => 100 + ((i * 37) % 5000));

test('a request only the larger decode takes is served there, not refused by the proxy', async () => {
  const started: Instance[] = await Promise.all([
    startInstance(opts('both', 512), env),
    startInstance(opts('prefill', 512), env),
    startInstance(opts('decode', 128), env),
    startInstance(opts('decode', 512), env),
  ]);
  closers.push(...started.map((i) => () => i.close()));
  const [colocated, p, small, large] = started as [Instance, Instance, Instance, Instance];
  const proxy = new Proxy(
    { ...DEFAULT_PROXY_OPTIONS, prefillUrls: [p.url], decodeUrls: [small.url, large.url], healthTimeoutMs: 2000 },
    env,
  );
  closers.push(() => proxy.close());
  const url = `http://127.0.0.1:${await proxy.listen(0, '127.0.0.1')}`;
  await proxy.start();
  const body = { prompt: prompt(200), max_tokens: 4, temperature: 0, ignore_eos: true, return_token_ids: true };
  const ref = await complete(colocated.url, body);
  for (let k = 0; k < 2; k++) {
    // Twice: round robin would give one of them to the small decode.
    const pd = await complete(url, body);
    assert.equal(pd.status, 200, JSON.stringify(pd.json));
    assert.deepEqual(pd.json.choices[0].token_ids, ref.json.choices[0].token_ids);
  }
  const short = await complete(url, { ...body, prompt: prompt(20) });
  assert.equal(short.status, 200, 'a request both take still runs');
  const tooLong = await complete(url, { ...body, prompt: prompt(510) });
  assert.equal(tooLong.status, 400, 'what no decode takes is still refused');
  assert.equal(tooLong.json.error.code, 'PROMPT_TOO_LONG');
});

test('a prompt only the larger prefill takes goes to that prefill, not refused by the smaller one', async () => {
  const started: Instance[] = await Promise.all([
    startInstance(opts('both', 512), env),
    startInstance(opts('prefill', 128), env),
    startInstance(opts('prefill', 512), env),
    startInstance(opts('decode', 512), env),
  ]);
  closers.push(...started.map((i) => () => i.close()));
  const [colocated, small, large, d] = started as [Instance, Instance, Instance, Instance];
  const proxy = new Proxy(
    { ...DEFAULT_PROXY_OPTIONS, prefillUrls: [small.url, large.url], decodeUrls: [d.url], healthTimeoutMs: 2000 },
    env,
  );
  closers.push(() => proxy.close());
  const url = `http://127.0.0.1:${await proxy.listen(0, '127.0.0.1')}`;
  await proxy.start();
  const body = { prompt: prompt(200), max_tokens: 4, temperature: 0, ignore_eos: true, return_token_ids: true };
  const ref = await complete(colocated.url, body);
  for (let k = 0; k < 2; k++) {
    const pd = await complete(url, body);
    assert.equal(pd.status, 200, JSON.stringify(pd.json));
    assert.deepEqual(pd.json.choices[0].token_ids, ref.json.choices[0].token_ids);
  }
});
