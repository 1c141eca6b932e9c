/**
 * Kernels that kill their compute thread on purpose, for the threaded device's death tests
 * (thread_death.test.ts): a thread that exits, and one that dies of an uncaught non-Error value.
 */
import type { KernelFn, KernelRanks } from './types.ts';

export function createKernels(_init: unknown, _slabs: Uint8Array[], ranks?: KernelRanks): Record<string, KernelFn> {
  const rank = ranks?.ranks[0] ?? 0;
  const cell = new Int32Array(new SharedArrayBuffer(4));
  return {
    // Rank 0's thread exits; every other rank works `ms` first (a rank still busy when rank 0 dies).
    exitOnRank0: (args) => {
      if (rank === 0) process.exit(7);
      Atomics.wait(cell, 0, 0, (args as { ms: number }).ms);
      return 2;
    },
    // Throws `value` later, outside the op: an uncaught exception in the thread (`throw null` included).
    asyncThrow: (args) => {
      setTimeout(() => {
        throw (args as { value: unknown }).value;
      }, 0);
      return new Promise(() => undefined);
    },
  };
}
