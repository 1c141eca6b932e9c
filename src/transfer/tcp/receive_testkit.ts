/**
 * Test kit for the tcp receive-path tests (nic_tcp_client.test.ts, nic_tcp_server.test.ts): page mappings
 * (page i+1 of the sending side to a shuffled page of the receiving side, in runs of up to `runMax` pages
 * that stay contiguous, so some ranges coalesce) and a bounded wait.
 */
import assert from 'node:assert/strict';
import fc from 'fast-check';
import type { TransferRange } from '../core/types.ts';

/**
 * Arbitrary page mappings of `pageBytes` pages, alternating slabs 0 and 1. `receiver` names which side of
 * a TransferRange holds the shuffled pages: 'local' for a READ (we receive), 'remote' for a WRITE.
 */
export function shuffledPages(
  pageBytes: number,
  pagesMax: number,
  runMaxMax: number,
  receiver: 'local' | 'remote',
): fc.Arbitrary<TransferRange[]> {
  return fc
    .record({
      pages: fc.integer({ min: 1, max: pagesMax }),
      seed: fc.integer(),
      runMax: fc.integer({ min: 1, max: runMaxMax }),
    })
    .map(({ pages, seed, runMax }) => {
      const to = Array.from({ length: pages }, (_, i) => i + 1);
      let x = seed >>> 0;
      for (let i = to.length - 1; i > 0; i -= 1 + (x % runMax)) {
        x = (Math.imul(x, 1103515245) + 12345) >>> 0;
        const j = x % (i + 1);
        [to[i], to[j]] = [to[j] as number, to[i] as number];
      }
      return to.map((t, i) => {
        const [from, dest] = [(i + 1) * pageBytes, t * pageBytes];
        return receiver === 'local'
          ? { slab: i % 2, remoteOffset: from, localOffset: dest, length: pageBytes }
          : { slab: i % 2, localOffset: from, remoteOffset: dest, length: pageBytes };
      });
    });
}

/** Resolve once `cond()` holds; fail after `ms`. */
export async function until(cond: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    assert.ok(Date.now() < end, 'condition not met in time');
    await new Promise((r) => setTimeout(r, 2));
  }
}

/**
 * Every receiving slab holds its source page where `ranges` map one (`receiver` as in shuffledPages) and
 * `sentinel` everywhere else.
 */
export function assertLanded(
  slabs: Uint8Array[],
  source: Uint8Array[],
  ranges: TransferRange[],
  receiver: 'local' | 'remote',
  sentinel: number,
): void {
  const want = slabs.map((s) => new Uint8Array(s.length).fill(sentinel));
  for (const r of ranges) {
    const [from, to] = receiver === 'local' ? [r.remoteOffset, r.localOffset] : [r.localOffset, r.remoteOffset];
    (want[r.slab] as Uint8Array).set((source[r.slab] as Uint8Array).subarray(from, from + r.length), to);
  }
  slabs.forEach((s, i) => assert.ok(Buffer.compare(s, want[i] as Uint8Array) === 0, `slab ${i} differs`));
}
