/**
 * BlockZeroer: zeroes whole pages of every attention slab for the listed block ids, as an op on the
 * compute stream (so it runs after everything enqueued before it, e.g. the previous forward, and before
 * the next forward). Built only when the cache needs zeroing (needsKvCacheZeroing). Mamba state pages
 * are never listed by the scheduler; the zeroer still refuses the null block and out-of-range ids.
 */
import { assert } from '../util/assert.ts';
import type { Device, OpTicket } from '../device/types.ts';
import { attentionSlabs, type KVCacheConfig } from '../kv/spec.ts';

export class BlockZeroer {
  readonly slabs: number[];
  pagesZeroed = 0;

  constructor(
    private readonly device: Device,
    readonly config: KVCacheConfig,
  ) {
    assert(config.needsKvCacheZeroing, 'a BlockZeroer exists only when the KV cache needs zeroing');
    this.slabs = attentionSlabs(config);
    assert(this.slabs.length > 0, 'zeroing needs at least one attention slab');
  }

  /** Zero block 0 once (it pads block tables and must never hold stale bytes). */
  warmup(): OpTicket {
    return this.device.compute.enqueue({
      op: { kind: 'zero', blockIds: [0], slabs: this.slabs },
      label: { what: 'zero-warmup' },
    });
  }

  zeroBlockIds(blockIds: readonly number[], step: number): OpTicket | null {
    if (blockIds.length === 0) return null;
    for (const b of blockIds) {
      assert(Number.isInteger(b) && b > 0 && b < this.config.numBlocks, `zero list holds invalid block id ${b}`);
    }
    this.pagesZeroed += blockIds.length;
    return this.device.compute.enqueue({
      op: { kind: 'zero', blockIds: [...blockIds], slabs: this.slabs },
      label: { what: 'zero', step },
    });
  }
}
