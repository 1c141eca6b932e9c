/**
 * Test kit (not used in production): the real step kernel with injected device failures, loaded by URL
 * like src/worker/kernels.ts. A request whose id starts with FAIL_REQUEST_PREFIX throws inside its own
 * forward (a device error for one sequence); one whose id starts with FAIL_STEP_PREFIX makes the whole
 * step op throw (every request of that step is lost); one whose id starts with FAIL_LAST_RANK_PREFIX throws
 * on the last tensor parallel rank only (the others must learn it through the collective); one whose id starts
 * with FAIL_RANK_STEP_PREFIX makes the whole step op throw on the last rank only, before any request's forward
 * (the other ranks wait for it in the collective). Three more kill the last rank's thread: EXIT_LAST_RANK_PREFIX
 * (it exits mid-step), CRASH_LAST_RANK_PREFIX (an uncaught exception outside the kernel, mid-step) and
 * DIE_AFTER_LAST_RANK_PREFIX (the request completes; the thread dies after the step forgetting it, the engine idle).
 */
import { createModel } from '../model/model.ts';
import type { ModelKernelInit } from '../model/types.ts';
import type { KernelFn, KernelRanks } from '../device/types.ts';
import { createStepKernel, type StepArgs } from './kernels.ts';

export const FAIL_REQUEST_PREFIX = 'fail-kernel-';
export const FAIL_STEP_PREFIX = 'fail-step-';
export const FAIL_LAST_RANK_PREFIX = 'fail-last-rank-';
export const FAIL_RANK_STEP_PREFIX = 'rank-step-fail-';
/** The last rank's thread exits (process.exit in a worker ends that thread) when a step names such a request. */
export const EXIT_LAST_RANK_PREFIX = 'exit-last-rank-';
/** The last rank's thread dies of an uncaught exception thrown outside the kernel, which never returns. */
export const CRASH_LAST_RANK_PREFIX = 'crash-last-rank-';
/** The last rank's thread dies of an unhandled rejection just after the step that forgets such a request (idle). */
export const DIE_AFTER_LAST_RANK_PREFIX = 'die-after-last-rank-';
export const FAILING_KERNELS_URL = new URL('./kernels_testkit.ts', import.meta.url).href;

export async function createKernels(
  init: ModelKernelInit,
  _slabs: Uint8Array[],
  ranks?: KernelRanks,
): Promise<Record<string, KernelFn>> {
  const model = createModel(init.preset, init.seed, init.kvConfig, ranks);
  const lastRank = ranks !== undefined && ranks.ranks.includes(ranks.size - 1);
  const step = createStepKernel((args, slabs) => {
    if (args.requests.some((r) => r.requestId.startsWith(FAIL_REQUEST_PREFIX)))
      throw new Error('injected kernel failure');
    if (lastRank && args.requests.some((r) => r.requestId.startsWith(FAIL_LAST_RANK_PREFIX)))
      throw new Error('injected failure on the last rank');
    return model.forward(args, slabs);
  }, ranks?.collective ?? null);
  return {
    step: (raw: unknown, slabs: Uint8Array[]) => {
      const ids = (raw as StepArgs).requests.map((r) => r.requestId);
      if (ids.some((id) => id.startsWith(FAIL_STEP_PREFIX))) throw new Error('injected step failure');
      if (lastRank && ids.some((id) => id.startsWith(EXIT_LAST_RANK_PREFIX))) process.exit(9);
      if (lastRank && ids.some((id) => id.startsWith(CRASH_LAST_RANK_PREFIX))) {
        // An unhandled rejection in a worker thread kills it, as an uncaught exception does.
        void Promise.resolve().then(() => {
          throw new Error('rank thread crashed');
        });
        return new Promise(() => undefined);
      }
      if (lastRank && (raw as StepArgs).forget.some((id) => id.startsWith(DIE_AFTER_LAST_RANK_PREFIX))) {
        // After this op: the engine has nothing left to run.
        void Promise.resolve().then(() => {
          throw new Error('rank thread crashed while idle');
        });
      }
      if (lastRank && ids.some((id) => id.startsWith(FAIL_RANK_STEP_PREFIX)))
        throw new Error('injected step failure on the last rank');
      return step(raw, slabs);
    },
  };
}
