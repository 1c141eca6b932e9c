/**
 * Kernels that kill their compute thread on purpose, for the threaded device's death tests
 * (thread_death.test.ts): a thread that exits, one that dies of an uncaught non-Error value, and a gang
 * kernel whose rank 0 fails at once while rank 1 still works.
 */
import type { KernelFn, KernelRanks } from './types.ts';

export function createKernels(_init: unknown, slabs: Uint8Array[], ranks?: KernelRanks): Record<string, KernelFn> {
  const rank = ranks?.ranks[0] ?? 0;
  const cell = new Int32Array(new SharedArrayBuffer(4));
  return {
    // Rank 0's thread exits; every other rank works `ms` first (a rank still busy when rank 0 dies).
    exitOnRank0: (args) => {
      if (rank === 0) process.exit(7);
      Atomics.wait(cell, 0, 0, (args as { ms: number }).ms);
      return 2;
    },
    // Rank 0 fails at once; rank 1 works `ms`, then writes 0x77 over page 0 of its slab (slab 1).
    failFastOnRank0: (args) => {
      if (rank === 0) throw new Error('rank 0 failed');
      Atomics.wait(cell, 0, 0, (args as { ms: number }).ms);
      (slabs[1] as Uint8Array).fill(0x77, 0, 64);
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
