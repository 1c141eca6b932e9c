/**
 * Tensor parallelism end to end in one engine on the real threaded device: with
 * `tensorParallelSize: 2` each rank is its own compute thread with its own slabs, and the model's
 * reductions meet in the shared-memory collective. Proves the output equals TP=1 token for token and
 * logit for logit (concurrent requests, greedy and sampled, prefill and decode), with the race checker
 * on and silent; a request that fails on one rank only fails alone on every rank, its batch-mates and
 * the engine unharmed; and a degree that does not divide the model is refused with BAD_CONFIG.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import type { RaceChecker } from '../device/race/race_checker.ts';
import type { ModelPreset } from '../kv/presets.ts';
import { FAILING_KERNELS_URL, FAIL_LAST_RANK_PREFIX } from '../worker/kernels_testkit.ts';
import { LLMEngine, kvCacheConfigOf, type EngineCreateConfig, type GenerateRequest } from './llm_engine.ts';
import { KERNEL_MODULE_URL, threadedDevice } from './devices.ts';

function config(preset: ModelPreset, tp: number, kernels = KERNEL_MODULE_URL): EngineCreateConfig {
  return {
    preset,
    modelSeed: 5,
    numBlocks: 64,
    tensorParallelSize: tp,
    asyncScheduling: true,
    scheduler: { maxNumBatchedTokens: 64, maxNumSeqs: 8 },
    idlePollMs: 2,
    makeDevice: threadedDevice(preset, 5, true, kernels),
  };
}

const req = (id: string, n: number, temperature = 0): GenerateRequest => ({
  requestId: id,
  promptTokenIds: Array.from({ length: n }, (_, i) => (n * 131 + i * 7919) % 50000),
  sampling: { maxTokens: 4, temperature, seed: n, ignoreEos: true },
});

/** Three concurrent requests (one prefilled in chunks of the 64-token budget, one sampled). */
async function serve(preset: ModelPreset, tp: number): Promise<string[]> {
  const e = await LLMEngine.create(config(preset, tp), new RealEnv(1));
  try {
    const outs = await Promise.all([e.generate(req('a', 90)), e.generate(req('b', 7, 0.8)), e.generate(req('c', 33))]);
    const checker = e.device.raceChecker as RaceChecker | null;
    assert.ok(checker !== null);
    assert.deepEqual(checker.races(), [], 'no race on any rank');
    return outs.map((o) => `${o.tokenIds.join(',')}|${o.logitsHashes.join(',')}`);
  } finally {
    await e.close();
  }
}

for (const preset of ['llama-mini', 'dsv4-mini'] as const) {
  test(`${preset} on the threaded device: TP=2 (two compute threads, own slabs, shared-memory collective) equals TP=1`, async () => {
    const one = await serve(preset, 1);
    const two = await serve(preset, 2);
    assert.deepEqual(two, one);
  });
}

test('TP=2: a request that fails on the last rank only fails alone (every rank agrees); batch-mates and the engine go on', async () => {
  const env = new RealEnv(2);
  const e = await LLMEngine.create(config('llama-mini', 2, FAILING_KERNELS_URL), env);
  try {
    const alone = await e.generate(req('x0', 12));
    const [ok, bad] = await Promise.allSettled([
      e.generate(req('x1', 12)),
      e.generate(req(`${FAIL_LAST_RANK_PREFIX}1`, 9)),
    ]);
    assert.equal(ok.status, 'fulfilled');
    assert.deepEqual(ok.status === 'fulfilled' && ok.value.tokenIds, alone.tokenIds);
    assert.equal(bad.status, 'rejected');
    const err = (bad as PromiseRejectedResult).reason as HandoffError;
    assert.ok(err instanceof HandoffError && err.code === 'INTERNAL', String(err));
    assert.match(err.message, /failed on another tensor parallel rank|another tensor parallel rank failed/);
    assert.equal(e.core.crashed, null);
    assert.deepEqual((await e.generate(req('x2', 12))).tokenIds, alone.tokenIds, 'still serving, same tokens');
  } finally {
    await e.close();
  }
});

test('a tensor parallel size that does not divide the KV heads and the model shards is BAD_CONFIG', () => {
  for (const tp of [0, 3, 4, 1.5])
    assert.throws(
      () => kvCacheConfigOf({ ...config('llama-mini', 1), tensorParallelSize: tp }),
      (err: unknown) =>
        err instanceof HandoffError && err.code === 'BAD_CONFIG' && /must divide the KV heads/.test(err.message),
      `TP ${tp}`,
    );
  assert.equal(kvCacheConfigOf(config('hybrid-mini', 2)).numSlabs, 4);
});
