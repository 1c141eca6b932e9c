/**
 * A kernel that returns a promise (async_kernel.test.ts): it fills page (slab 0, block 0) with 5 a
 * little later, then returns 7. `init` must be `{ pageBytes }`.
 */
import { setTimeout as delay } from 'node:timers/promises';
import type { KernelFn } from './types.ts';

export function createKernels(init: unknown, slabs: Uint8Array[]): Record<string, KernelFn> {
  const { pageBytes } = init as { pageBytes: number };
  return {
    lateWrite: async () => {
      await delay(20);
      (slabs[0] as Uint8Array).fill(5, 0, pageBytes);
      return 7;
    },
  };
}
