/**
 * Kernels for early_death.test.ts: with TP=2, rank 0's thread dies of an uncaught error right after it
 * reported ready (300 ms after), while rank 1 is still loading (rank 1 finishes loading only once rank 0 has thrown).
 */
import type { KernelFn, KernelRanks } from './types.ts';

export function createKernels(_init: unknown, slabs: Uint8Array[], ranks?: KernelRanks): Record<string, KernelFn> {
  const rank = ranks?.ranks[0] ?? 0;
  const flag = new Int32Array((slabs[0] as Uint8Array).buffer, 0, 1);
  if (rank === 0) {
    // Late enough for the host to have taken this rank's ready (the error and the ready reach the host on
    // different channels, in no guaranteed order): a death before that is a failed start, not this test.
    setTimeout(() => {
      Atomics.store(flag, 0, 1);
      Atomics.notify(flag, 0);
      throw new Error('rank 0 died after start');
    }, 300);
  } else {
    Atomics.wait(flag, 0, 0, 30_000);
    // Give rank 0's death time to reach the host before this rank reports ready.
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1_000);
  }
  return { ok: () => 1 };
}
