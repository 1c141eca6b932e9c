/**
 * TP=2 on the threaded device: a step op that throws on one rank only, before any request's forward (a planted
 * device error outside the per-request agreement), fails that step's requests at once and leaves the ranks'
 * collective clean for the next steps. Before the fix the other rank waited for it in the collective twice
 * over (60 s in a gather, 60 s in the agreement): the whole engine stalled 120 s, and the shared barrier state
 * was left half-counted (aborted flag and agreement arrivals set), so a later healthy request could fail or
 * stall another 60 s.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { FAILING_KERNELS_URL, FAIL_RANK_STEP_PREFIX } from '../worker/kernels_testkit.ts';
import { LLMEngine, type GenerateRequest, type GenerateResult } from './llm_engine.ts';
import { threadedDevice } from './devices.ts';

const env = new RealEnv(11);
/** Far below the collective's 60 s wait bound, far above a step of these tiny requests. */
const HANG_MS = 20_000;

const req = (id: string, n: number): GenerateRequest => ({
  requestId: id,
  promptTokenIds: Array.from({ length: n }, (_, i) => (n * 131 + i * 7919) % 50000),
  sampling: { maxTokens: 4, temperature: 0, ignoreEos: true },
});

/** The request's outcome, or a test failure when it is still unsettled after HANG_MS. */
function bounded(p: Promise<GenerateResult>, what: string): Promise<PromiseSettledResult<GenerateResult>> {
  let timer: { cancel(): void } | null = null;
  const hung = new Promise<never>((_, reject) => {
    timer = env.setTimer(HANG_MS, () => reject(new Error(`${what} still unsettled after ${HANG_MS} ms`)));
  });
  const settled = Promise.allSettled([p]).then(([r]) => r as PromiseSettledResult<GenerateResult>);
  return Promise.race([settled, hung]).finally(() => timer?.cancel());
}

test('TP=2: a step op failing on the last rank only fails its step at once; later requests are served', async () => {
  const e = await LLMEngine.create(
    {
      preset: 'llama-mini',
      modelSeed: 5,
      numBlocks: 64,
      tensorParallelSize: 2,
      asyncScheduling: true,
      scheduler: { maxNumBatchedTokens: 64, maxNumSeqs: 8 },
      idlePollMs: 2,
      makeDevice: threadedDevice('llama-mini', 5, false, FAILING_KERNELS_URL),
    },
    env,
  );
  let hung = false;
  try {
    const alone = await e.generate(req('x0', 12));
    const bad = await bounded(e.generate(req(`${FAIL_RANK_STEP_PREFIX}1`, 9)), 'the failed request').catch((err) => {
      hung = true;
      throw err;
    });
    assert.equal(bad.status, 'rejected');
    const err = (bad as PromiseRejectedResult).reason as HandoffError;
    assert.ok(err instanceof HandoffError && err.code === 'INTERNAL', String(err));
    assert.equal(e.core.crashed, null);
    // Healthy requests after it, alone and together: the collective carries nothing of the failed step over.
    for (const ids of [['x1'], ['x2', 'x3'], ['x4']]) {
      const outs = await Promise.all(ids.map((id) => bounded(e.generate(req(id, 12)), id))).catch((err2) => {
        hung = true;
        throw err2;
      });
      for (const [k, o] of outs.entries()) {
        assert.equal(o.status, 'fulfilled', `${ids[k]}: ${o.status === 'rejected' ? String(o.reason) : ''}`);
        assert.deepEqual(o.status === 'fulfilled' && o.value.tokenIds, alone.tokenIds, `${ids[k]}: same tokens`);
      }
    }
  } finally {
    // A rank still waiting in the collective would hold close() until its wait bound: stop the threads instead
    // (the engine loop then dies on the closed device, which is reported through `crashed`, not thrown).
    if (hung) {
      e.core.reportCrashesViaCrashed();
      await e.device.close();
    } else await e.close();
  }
});
