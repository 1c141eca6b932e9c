/**
 * Byte ranges of a work request: coalescing, bounds checks, and the mapping from a transfer's byte
 * stream (the concatenation of its ranges, in order) back to slab offsets.
 *
 *   ranges:  [slab0 @ 64..128) [slab0 @ 128..192) [slab1 @ 0..64)
 *   stream:  0 ............... 64 ............... 128 ......... 192
 */
import { assert } from '../../util/assert.ts';
import type { SlabLayout, TransferRange } from './types.ts';

/** A range on one side only (what crosses the wire to the serving NIC). */
export interface WireRange {
  slab: number;
  offset: number;
  length: number;
}

export function totalBytes(ranges: readonly { length: number }[]): number {
  let n = 0;
  for (const r of ranges) n += r.length;
  return n;
}

/**
 * Merge ranges that are contiguous on both sides (same slab, remote and local both continue), after
 * sorting by (slab, remoteOffset). Bytes and their local<->remote mapping are preserved.
 */
export function coalesceRanges(ranges: readonly TransferRange[]): TransferRange[] {
  const sorted = [...ranges].sort(
    (a, b) => a.slab - b.slab || a.remoteOffset - b.remoteOffset || a.localOffset - b.localOffset,
  );
  const out: TransferRange[] = [];
  for (const r of sorted) {
    assert(r.length > 0, 'coalesceRanges: zero-length range');
    const last = out[out.length - 1];
    if (
      last !== undefined &&
      last.slab === r.slab &&
      last.remoteOffset + last.length === r.remoteOffset &&
      last.localOffset + last.length === r.localOffset
    ) {
      last.length += r.length;
    } else {
      out.push({ ...r });
    }
  }
  return out;
}

function isNonNegInt(x: number): boolean {
  return Number.isSafeInteger(x) && x >= 0;
}

/** Why a range does not fit the layout, or null. */
export function rangeProblem(r: WireRange, layout: SlabLayout): string | null {
  const slabBytes = layout.numBlocks * layout.pageBytes;
  if (!isNonNegInt(r.slab) || r.slab >= layout.numSlabs)
    return `slab ${r.slab} out of range (numSlabs ${layout.numSlabs})`;
  if (!isNonNegInt(r.offset) || !isNonNegInt(r.length) || r.length === 0)
    return `bad range offset ${r.offset} length ${r.length}`;
  if (r.offset + r.length > slabBytes)
    return `range [${r.offset}, ${r.offset + r.length}) beyond slab end ${slabBytes}`;
  return null;
}

/** Every page a range touches lies in `blocks`; null when it does, else the first page that does not. */
export function pagesOutside(r: WireRange, pageBytes: number, blocks: ReadonlySet<number>): number | null {
  const first = Math.floor(r.offset / pageBytes);
  const last = Math.floor((r.offset + r.length - 1) / pageBytes);
  for (let b = first; b <= last; b++) if (!blocks.has(b)) return b;
  return null;
}

/** The local and remote sides of a request as wire ranges, in the same order. */
export function localSide(ranges: readonly TransferRange[]): WireRange[] {
  return ranges.map((r) => ({ slab: r.slab, offset: r.localOffset, length: r.length }));
}
export function remoteSide(ranges: readonly TransferRange[]): WireRange[] {
  return ranges.map((r) => ({ slab: r.slab, offset: r.remoteOffset, length: r.length }));
}

/**
 * Work requests cross thread boundaries with their ranges packed as [slab, local, remote, length]*n
 * in a Float64Array: structured-cloning thousands of small objects costs more than the copy itself.
 */
export function packRanges(ranges: readonly TransferRange[]): Float64Array {
  const p = new Float64Array(ranges.length * 4);
  ranges.forEach((r, i) => p.set([r.slab, r.localOffset, r.remoteOffset, r.length], i * 4));
  return p;
}

export function unpackRanges(p: Float64Array): TransferRange[] {
  assert(p.length % 4 === 0, 'packed ranges come in fours');
  const out: TransferRange[] = [];
  for (let i = 0; i < p.length; i += 4) {
    out.push({
      slab: p[i] as number,
      localOffset: p[i + 1] as number,
      remoteOffset: p[i + 2] as number,
      length: p[i + 3] as number,
    });
  }
  return out;
}

/** True when no two ranges overlap (same slab, intersecting bytes). */
export function disjoint(ranges: readonly WireRange[]): boolean {
  const sorted = [...ranges].sort((a, b) => a.slab - b.slab || a.offset - b.offset);
  for (let i = 1; i < sorted.length; i++) {
    const a = sorted[i - 1];
    const b = sorted[i];
    if (a && b && a.slab === b.slab && a.offset + a.length > b.offset) return false;
  }
  return true;
}

/**
 * Maps positions of a transfer's byte stream to (range, offset). Pieces must arrive in order
 * (`expected` is the next stream offset), as they do over one ordered connection.
 */
export class RangeStream {
  readonly total: number;
  private index = 0;
  private inRange = 0;
  expected = 0;

  constructor(readonly ranges: readonly WireRange[]) {
    this.total = totalBytes(ranges);
  }

  get complete(): boolean {
    return this.expected === this.total;
  }

  /** Visit the slab segments of the next `length` stream bytes: fn(slab, slabOffset, pieceOffset, segLength). */
  advance(
    length: number,
    fn: (slab: number, slabOffset: number, pieceOffset: number, segLength: number) => void,
  ): void {
    assert(this.expected + length <= this.total, 'RangeStream: advance past the end');
    let done = 0;
    while (done < length) {
      const r = this.ranges[this.index];
      assert(r !== undefined, 'RangeStream: ran out of ranges');
      const seg = Math.min(r.length - this.inRange, length - done);
      fn(r.slab, r.offset + this.inRange, done, seg);
      done += seg;
      this.inRange += seg;
      if (this.inRange === r.length) {
        this.index++;
        this.inRange = 0;
      }
    }
    this.expected += length;
  }

  /** Move past `length` stream bytes without visiting them (a denied or aborted transfer's data). */
  skip(length: number): void {
    assert(this.expected + length <= this.total, 'RangeStream: skip past the end');
    this.advance(length, () => {});
  }
}
