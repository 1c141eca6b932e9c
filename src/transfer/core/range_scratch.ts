/**
 * Reusable buffers for posting work requests: the packed ranges, the page bitmap of the overlap check
 * and the coalesced result. A typed array allocated per work request can cost more than the work on
 * its ranges (on the dev VM a fresh 64 KiB Float64Array took 25-100 us; checking 2048 ranges, ~20 us).
 * Results are views of these buffers, valid until the next call.
 */
import type { SlabLayout, TransferRange } from './types.ts';
import { coalescePacked, disjointSide, packRanges, PACKED_STRIDE, type SideRanges } from './ranges.ts';

function grown<T extends Float64Array | Uint8Array>(buf: T, need: number, make: (n: number) => T): T {
  return buf.length >= need ? buf : make(Math.max(need, 2 * buf.length));
}

export class RangeScratch {
  private packed = new Float64Array(0);
  private coalesced = new Float64Array(0);
  private bitmap = new Uint8Array(0);

  pack(ranges: readonly TransferRange[]): Float64Array {
    this.packed = grown(this.packed, ranges.length * PACKED_STRIDE, (n) => new Float64Array(n));
    return packRanges(ranges, this.packed);
  }

  /** coalescePacked into the reused buffer (or `p` itself when nothing merges). */
  coalesce(p: Float64Array): Float64Array {
    this.coalesced = grown(this.coalesced, p.length, (n) => new Float64Array(n));
    return coalescePacked(p, this.coalesced);
  }

  disjoint(side: SideRanges, layout: SlabLayout): boolean {
    this.bitmap = grown(this.bitmap, layout.numSlabs * layout.numBlocks, (n) => new Uint8Array(n));
    return disjointSide(side, layout, this.bitmap);
  }
}
