/**
 * Feeds a PageLifecycle from the block pool's and the compute stream's observers (observe, never
 * change): pages leaving and re-entering the free queue, zero/copy/forward ops enqueued and executed.
 * Used by the simulator and, under `--race-check`, by a serving instance (engine/lifecycle_oracle.ts).
 * Transfers and grants are not seen here: the simulator feeds them from its fabric's events.
 */
import type { Stream } from '../device/types.ts';
import type { BlockPool } from './block_pool.ts';
import type { KVCacheManager } from './kv_cache_manager.ts';
import type { PageLifecycle } from './page_lifecycle.ts';

/** Pages popped (stale bytes), revived by a prefix hit (valid KV), and back in the free queue. */
export function watchPool(lc: PageLifecycle, pool: BlockPool): () => void {
  return pool.observe({
    allocated: (ids) => lc.allocated(ids, true),
    revived: (ids) => lc.allocated(ids, false),
    freed: (ids) => lc.freed(ids),
  });
}

/** Zero and zero-spans ops, forwards (their declared footprint) and copy-on-write copies (whole pages) on `stream`. */
export function watchStream(lc: PageLifecycle, stream: Stream, pageBytes: number): () => void {
  return stream.observe({
    enqueued(sub, opId) {
      const op = sub.op;
      if (op.kind === 'zero') lc.zeroEnqueued(opId, op.blockIds, op.slabs);
      if (op.kind === 'zero-spans') lc.spansZeroEnqueued(opId, op.spans);
      if (op.kind === 'kernel') lc.forwardEnqueued(opId, sub.footprint ?? []);
      if (op.kind === 'copy')
        lc.forwardEnqueued(
          opId,
          op.pairs.flatMap(([src, dst]) => [
            { slab: 0, block: src, start: 0, end: pageBytes, write: false },
            { slab: 0, block: dst, start: 0, end: pageBytes, write: true },
          ]),
        );
    },
    executed(opId) {
      // Op ids are unique per device: each call ignores an id it was not told about (a sleep op).
      lc.zeroRan(opId);
      lc.spansZeroRan(opId);
      lc.forwardRan(opId);
    },
  });
}

/** Pages a rolled-back load gives back to zeroing (a recompute): the KV they hold is given up, not wiped. */
export function watchRollbacks(lc: PageLifecycle, kv: KVCacheManager): () => void {
  return kv.observeRerecords((ids) => lc.rolledBack(ids));
}
