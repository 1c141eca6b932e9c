/**
 * A request whose forward fails on the device fails alone: the engine loop, the process and the other
 * requests of the step go on (the same tokens as without the failure), nothing leaks, and the engine
 * keeps serving. A step op that fails as a whole fails only the requests of that step. Pages a failed
 * step wrote never serve a prefix hit. Bad sampling values that slipped past the HTTP edge are refused
 * when the engine makes the request, before they can reach the sampler's assertions.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { FAILING_KERNELS_URL, FAIL_REQUEST_PREFIX, FAIL_STEP_PREFIX } from '../worker/kernels_testkit.ts';
import { LLMEngine, type EngineCreateConfig, type GenerateRequest } from './llm_engine.ts';
import { simDevice, threadedDevice } from './devices.ts';
import { fakeRun, makeRequest, makeScheduler, smallEngineConfig, spreadPrompt } from './scheduler_testkit.ts';

const prompt = spreadPrompt;

function config(kind: 'threaded' | 'sim'): EngineCreateConfig {
  return smallEngineConfig(
    kind === 'threaded'
      ? threadedDevice('dsv4-mini', 1, false, FAILING_KERNELS_URL)
      : simDevice('dsv4-mini', 1, { kernelModuleUrl: FAILING_KERNELS_URL }),
  );
}

const req = (id: string, base: number): GenerateRequest => ({
  requestId: id,
  promptTokenIds: prompt(20 + base, base),
  sampling: { maxTokens: 5, temperature: 0, ignoreEos: true },
});

async function idle(e: LLMEngine, env: RealEnv): Promise<void> {
  for (let k = 0; k < 400 && !e.core.isIdle(); k++) await env.sleep(5);
  assert.ok(e.core.isIdle(), 'engine idle');
  assert.equal(e.kv.getNumFreeBlocks(), 95, 'every page back');
}

for (const kind of ['sim', 'threaded'] as const) {
  test(`${kind} device: a request whose kernel throws fails alone with a 500; its batch-mates get their tokens; the engine keeps serving`, async () => {
    const env = new RealEnv(3);
    const e = await LLMEngine.create(config(kind), env);
    try {
      const alone = await e.generate(req('a0', 1));
      const [ok, bad, ok2] = await Promise.allSettled([
        e.generate(req('a1', 1)),
        e.generate(req(`${FAIL_REQUEST_PREFIX}1`, 2)),
        e.generate(req('a2', 3)),
      ]);
      assert.equal(ok.status, 'fulfilled');
      assert.equal(ok2.status, 'fulfilled');
      assert.deepEqual(
        ok.status === 'fulfilled' && ok.value.tokenIds,
        alone.tokenIds,
        'a batch-mate of the failing request is unaffected',
      );
      assert.equal(bad.status, 'rejected');
      const err = (bad as PromiseRejectedResult).reason as HandoffError;
      assert.ok(err instanceof HandoffError && err.code === 'INTERNAL' && err.httpStatus === 500, String(err));
      assert.match(err.message, /injected kernel failure/);
      assert.equal(e.core.crashed, null, 'the engine loop is alive');
      assert.deepEqual((await e.generate(req('a3', 1))).tokenIds, alone.tokenIds, 'still serving, same tokens');
      await idle(e, env);
    } finally {
      await e.close();
    }
  });
}

test('a step op that fails as a whole fails the requests of that step only; later requests are served', async () => {
  const env = new RealEnv(3);
  const e = await LLMEngine.create(config('sim'), env);
  try {
    const alone = await e.generate(req('b0', 4));
    const results = await Promise.allSettled([e.generate(req(`${FAIL_STEP_PREFIX}1`, 5)), e.generate(req('b1', 4))]);
    assert.equal(results[0]?.status, 'rejected');
    assert.equal(((results[0] as PromiseRejectedResult).reason as HandoffError).code, 'INTERNAL');
    assert.match(
      ((results[0] as PromiseRejectedResult).reason as Error).message,
      /the forward of step \d+ failed: .*injected step failure/,
    );
    // b1 shared a step with the failing one (admitted together) or not; either way it ends, and typed.
    const b1 = results[1];
    if (b1?.status === 'fulfilled') assert.deepEqual(b1.value.tokenIds, alone.tokenIds);
    else assert.equal(((b1 as PromiseRejectedResult).reason as HandoffError).code, 'INTERNAL');
    assert.equal(e.core.crashed, null);
    assert.deepEqual((await e.generate(req('b2', 4))).tokenIds, alone.tokenIds, 'served after the failed step');
    await idle(e, env);
  } finally {
    await e.close();
  }
});

test('addRequest refuses sampling values the sampler would assert on (top_p 1.5, NaN temperature, ...) with BAD_REQUEST naming the field', async () => {
  const env = new RealEnv(3);
  const e = await LLMEngine.create(config('sim'), env);
  try {
    const bad: Array<[string, Partial<GenerateRequest['sampling']>]> = [
      ['top_p', { topP: 1.5 }],
      ['top_p', { topP: 0 }],
      ['temperature', { temperature: Number.NaN }],
      ['temperature', { temperature: -1 }],
      ['top_k', { topK: 2.5 }],
      ['seed', { seed: 2 ** 60 }],
      ['stop_token_ids', { stopTokenIds: [-3] }],
    ];
    for (const [param, s] of bad) {
      assert.throws(
        () => e.submit({ promptTokenIds: prompt(8, 1), sampling: { maxTokens: 2, ...s } }, () => undefined),
        (err: unknown) => err instanceof HandoffError && err.code === 'BAD_REQUEST' && err.details?.['param'] === param,
        `${param}: ${JSON.stringify(s)}`,
      );
    }
    assert.throws(
      () => e.submit({ promptTokenIds: [1, 60000], sampling: { maxTokens: 2 } }, () => undefined),
      /prompt token 1 is 60000/,
    );
    assert.equal(e.core.crashed, null);
    assert.equal(
      (await e.generate({ promptTokenIds: prompt(8, 1), sampling: { maxTokens: 2, topP: 1 } })).tokenIds.length,
      2,
    );
    await idle(e, env);
  } finally {
    await e.close();
  }
});

test('scheduler: pages a failed forward wrote are withdrawn from the prefix cache, and a request that already hit them fails too', () => {
  const { scheduler, kv } = makeScheduler({ numBlocks: 64 });
  const a = makeRequest(48, 3, null, 'a', 700);
  scheduler.addRequest(a);
  const s1 = scheduler.schedule();
  assert.equal(s1.numScheduledTokens['a'], 48);
  const b = makeRequest(40, 3, null, 'b', 700); // same first 32 tokens: hits a's first two pages, published at allocation
  scheduler.addRequest(b);
  const s2 = scheduler.schedule();
  assert.ok(b.numLocalHitTokens >= 32, `b hit a's pages (${b.numLocalHitTokens} tokens)`);
  const outs = scheduler.updateFromOutput(s1, { ...fakeRun(s1), sampled: [], forwardErrors: { a: 'boom' } });
  const byId = new Map(outs.map((o) => [o.requestId, o]));
  assert.equal(byId.get('a')?.error?.code, 'INTERNAL');
  assert.equal(byId.get('b')?.error?.code, 'INTERNAL', 'b read pages whose KV was never computed');
  assert.equal(
    kv.getComputedBlocks({ requestId: 'probe', tokenIds: a.promptTokenIds }).numComputedTokens,
    0,
    'nothing of a is published',
  );
  scheduler.updateFromOutput(s2, fakeRun(s2));
  assert.ok(scheduler.isQuiescent(), 'every page back');
});
