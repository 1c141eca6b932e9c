/**
 * The proxy takes kv_both instances in either pool, so a fleet of kv_both instances listed as both prefill
 * and decode (`proxy --prefill A,B --decode A,B`) is accepted, and routing may give one request's two legs
 * to the same instance. Both legs were sent under the same upstream request id, so decode's leg collided
 * with the prefill request that instance still held for it (READ: "request id ... is still in use"; WRITE:
 * "duplicate request id"): every such request failed with a 400 naming the client's X-Request-Id. Each leg
 * now goes under its own id: the request runs and gives colocated's tokens, and every page comes back.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance, type InstanceOptions } from './instance.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(41);
const closers: Array<() => Promise<unknown>> = [];
after(async () => {
  for (const c of closers.reverse()) await c();
});

function opts(kvTransferConfig: string | null): InstanceOptions {
  return {
    ...DEFAULT_INSTANCE_OPTIONS,
    role: 'both',
    port: 0,
    numBlocks: 64,
    kvTransferConfig,
    scheduler: { maxModelLen: 256 },
  };
}

async function complete(url: string, body: Record<string, unknown>): Promise<{ status: number; json: any }> {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': 'client-7' },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(30_000),
  });
  return { status: r.status, json: await r.json() };
}

const body = {
  prompt: Array.from({ length: 41 }, (_, i) => 100 + ((i * 37) % 5000)),
  max_tokens: 5,
  temperature: 0,
  ignore_eos: true,
  return_token_ids: true,
};

for (const mode of ['read', 'write'] as const) {
  test(`${mode.toUpperCase()}: one kv_both instance listed as prefill and decode serves a P/D request`, async () => {
    const config = JSON.stringify({ kv_connector_extra_config: { read_mode: mode === 'read' } });
    const [colocated, both] = await Promise.all([startInstance(opts(null), env), startInstance(opts(config), env)]);
    closers.push(
      () => colocated.close(),
      () => both.close(),
    );
    const proxy = new Proxy(
      { ...DEFAULT_PROXY_OPTIONS, mode, prefillUrls: [both.url], decodeUrls: [both.url], healthTimeoutMs: 2000 },
      env,
    );
    closers.push(() => proxy.close());
    const port = await proxy.listen(0, '127.0.0.1');
    await proxy.start();
    const ref = await complete(colocated.url, body);
    for (let k = 0; k < 2; k++) {
      const pd = await complete(`http://127.0.0.1:${port}`, body);
      assert.equal(pd.status, 200, JSON.stringify(pd.json));
      assert.deepEqual(pd.json.choices[0].token_ids, ref.json.choices[0].token_ids, 'the same tokens as colocated');
    }
    for (let k = 0; k < 2000 && !(both.engine.core.isIdle() && both.engine.kv.getNumFreeBlocks() === 63); k++)
      await env.sleep(5);
    assert.equal(both.engine.kv.getNumFreeBlocks(), 63, 'every page back');
  });
}
