/**
 * Tiny kernels for the device conformance suite, loaded by URL in the threaded device's thread and
 * in-process by the sim device. `init` must be `{ pageBytes }`.
 *
 * - pattern {slab, block, seed}: fill the page with patternByte(seed, i); returns nothing
 * - sum {slab, block}: sum of the page's bytes
 * - stamp {slab, block}: write this module instance's call counter (1, 2, ...) into byte 0; returns it
 * - echoInit: returns init (proves createKernels received it)
 * - fail {message}: throws
 * - echoRanks: what createKernels learned about ranks ({size, ranks, collective}); null when nothing
 * - gather: allGather of [rank + 1] over the ranks' collective (null without one)
 * - failOn {rank}: that rank aborts the unit; the others gather (and throw); every rank then agrees;
 *   returns {agreed, threw, after} where `after` is a gather run after the agreement (the collective reset)
 */
import { assert } from '../util/assert.ts';
import type { KernelFn, KernelRanks } from './types.ts';

export interface PageArgs {
  slab: number;
  block: number;
}

export function patternByte(seed: number, i: number): number {
  return (seed + i * 7) & 0xff;
}

export function createKernels(init: unknown, slabs: Uint8Array[], ranks?: KernelRanks): Record<string, KernelFn> {
  const pageBytes = (init as { pageBytes?: unknown } | null)?.pageBytes;
  assert(typeof pageBytes === 'number' && pageBytes > 0, 'test kernels need init.pageBytes');
  const page = (args: unknown): Uint8Array => {
    const { slab, block } = args as PageArgs;
    const s = slabs[slab];
    assert(s !== undefined, `no slab ${slab}`);
    return s.subarray(block * pageBytes, (block + 1) * pageBytes);
  };
  let stamps = 0;
  return {
    pattern: (args) => {
      const p = page(args);
      const seed = (args as { seed: number }).seed;
      for (let i = 0; i < p.length; i++) p[i] = patternByte(seed, i);
      return undefined;
    },
    sum: (args) => page(args).reduce((a, b) => a + b, 0),
    stamp: (args) => {
      stamps++;
      page(args)[0] = stamps & 0xff;
      return stamps;
    },
    echoInit: () => init,
    fail: (args) => {
      throw new Error((args as { message: string }).message);
    },
    ...rankKernels(ranks),
  };
}

function rankKernels(ranks: KernelRanks | undefined): Record<string, KernelFn> {
  const c = ranks?.collective ?? null;
  const gather = (): number[] | null => {
    if (c === null) return null;
    const out = new Float64Array(c.size);
    c.allGather(Float64Array.of(c.rank + 1), out);
    return [...out];
  };
  return {
    echoRanks: () =>
      ranks === undefined ? null : { size: ranks.size, ranks: ranks.ranks, collective: ranks.collective !== null },
    gather,
    failOn: (args) => {
      if (c === null) return null;
      const mine = c.rank === (args as { rank: number }).rank;
      let threw = false;
      if (mine) c.abort();
      else {
        try {
          gather();
          // catch-ok: a test kernel: the gather must throw because another rank aborted; the result says whether it did
        } catch {
          threw = true;
        }
      }
      const agreed = c.agree(mine);
      return { agreed, threw, after: gather() };
    },
  };
}
