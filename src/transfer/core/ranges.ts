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
 * Work requests carry their ranges packed as [localSlab, localOffset, remoteSlab, remoteOffset, length] * n
 * in one Float64Array: thousands of small objects cost more to sort, check, clone and walk than the bytes
 * they describe cost to copy (a 32 KiB page copies in ~3 us). Wire frames carry one side, [slab, offset,
 * length] * n. The two slabs differ only between engines of different tensor parallel degrees (a decode
 * rank's slab reads from another rank's slab of the prefill: rank * numLayerSlabs + layer on each side).
 */
export const PACKED_STRIDE = 5;
export const WIRE_STRIDE = 3;

/**
 * One side of packed ranges: range i is slab p[i*stride + at - 1], offset p[i*stride + at], length
 * p[i*stride + stride - 1] (the slab always precedes its offset).
 */
export interface SideRanges {
  readonly p: Float64Array;
  readonly stride: number;
  readonly at: number;
}

/** `into`: a buffer to reuse when it is long enough (the result is then a view of it). */
export function packRanges(ranges: readonly TransferRange[], into?: Float64Array): Float64Array {
  const need = ranges.length * PACKED_STRIDE;
  const p = into !== undefined && into.length >= need ? into.subarray(0, need) : new Float64Array(need);
  let k = 0;
  for (const r of ranges) {
    p[k++] = r.slab;
    p[k++] = r.localOffset;
    p[k++] = r.remoteSlab ?? r.slab;
    p[k++] = r.remoteOffset;
    p[k++] = r.length;
  }
  return p;
}

/** The objects of packed ranges; `remoteSlab` only where it differs from `slab` (as packRanges reads it). */
export function unpackRanges(p: Float64Array): TransferRange[] {
  assert(p.length % PACKED_STRIDE === 0, 'packed ranges come in fives');
  const out: TransferRange[] = [];
  for (let i = 0; i < p.length; i += PACKED_STRIDE) {
    const [slab, remoteSlab] = [p[i] as number, p[i + 2] as number];
    const r: TransferRange = {
      slab,
      localOffset: p[i + 1] as number,
      remoteOffset: p[i + 3] as number,
      length: p[i + 4] as number,
    };
    if (remoteSlab !== slab) r.remoteSlab = remoteSlab;
    out.push(r);
  }
  return out;
}

export function sideOf(p: Float64Array, side: 'local' | 'remote'): SideRanges {
  return { p, stride: PACKED_STRIDE, at: side === 'local' ? 1 : 3 };
}

export function wireSide(p: Float64Array): SideRanges {
  assert(p.length % WIRE_STRIDE === 0, 'wire ranges come in threes');
  return { p, stride: WIRE_STRIDE, at: 1 };
}

/** The longest range a wire frame carries (its length is a u32): longer ones travel as several. */
export const WIRE_RANGE_MAX = 2 ** 31;

/**
 * One side as wire ranges [slab, offset, length] * n (what a READ/WRITE frame names), the same byte
 * stream: a range longer than WIRE_RANGE_MAX (a whole 4 GiB slab coalesces into one) is cut in pieces.
 */
export function toWire(side: SideRanges): Float64Array {
  const n = sideCount(side);
  const { p, stride, at } = side;
  let pieces = 0;
  for (let i = 0, j = 0; i < n; i++, j += stride)
    pieces += Math.max(1, Math.ceil((p[j + stride - 1] as number) / WIRE_RANGE_MAX));
  const out = new Float64Array(pieces * WIRE_STRIDE);
  for (let i = 0, j = 0, k = 0; i < n; i++, j += stride) {
    const length = p[j + stride - 1] as number;
    let done = 0;
    do {
      const take = Math.min(WIRE_RANGE_MAX, length - done);
      out[k] = p[j + at - 1] as number;
      out[k + 1] = (p[j + at] as number) + done;
      out[k + 2] = take;
      k += WIRE_STRIDE;
      done += take;
    } while (done < length);
  }
  return out;
}

export function sideOfWire(ranges: readonly WireRange[]): SideRanges {
  const p = new Float64Array(ranges.length * WIRE_STRIDE);
  ranges.forEach((r, i) => p.set([r.slab, r.offset, r.length], i * WIRE_STRIDE));
  return wireSide(p);
}

export function wireOfSide(side: SideRanges): WireRange[] {
  const out: WireRange[] = [];
  const { p, stride, at } = side;
  for (let j = 0; j < p.length; j += stride)
    out.push({ slab: p[j + at - 1] as number, offset: p[j + at] as number, length: p[j + stride - 1] as number });
  return out;
}

export function sideCount(side: SideRanges): number {
  return side.p.length / side.stride;
}

export function sideBytes(side: SideRanges): number {
  let n = 0;
  const { p, stride } = side;
  for (let j = stride - 1; j < p.length; j += stride) n += p[j] as number;
  return n;
}

/**
 * The order of the ranges by (slab, offset at `at`): null when they already are in that order (one pass),
 * else a permutation. Sorting doubles that pack key and index is native and fast; when the product would
 * exceed 2^53, or a slab or offset is not a non-negative integer (an unchecked remote slab), a comparator
 * sort does it.
 */
function orderBy(side: SideRanges): Uint32Array | null {
  const { p, stride, at } = side;
  const n = sideCount(side);
  let sorted = true;
  let span = 1;
  let slabs = 1;
  // Packed keys need non-negative integers (a negative key made `key % n` a negative index): else the comparator.
  let keyable = true;
  for (let j = 0; j < p.length; j += stride) {
    const slab = p[j + at - 1] as number;
    const offset = p[j + at] as number;
    span = Math.max(span, offset + 1);
    slabs = Math.max(slabs, slab + 1);
    if (!(Number.isInteger(slab) && Number.isInteger(offset) && slab >= 0 && offset >= 0)) keyable = false;
    if (j === 0) continue;
    const slabStep = (p[j + at - 1] as number) - (p[j - stride + at - 1] as number);
    if (slabStep < 0 || (slabStep === 0 && (p[j - stride + at] as number) > (p[j + at] as number))) sorted = false;
  }
  if (sorted) return null;
  const order = new Uint32Array(n);
  if (keyable && slabs * span * n < Number.MAX_SAFE_INTEGER) {
    const keys = new Float64Array(n);
    for (let i = 0; i < n; i++)
      keys[i] = ((p[i * stride + at - 1] as number) * span + (p[i * stride + at] as number)) * n + i;
    keys.sort();
    for (let i = 0; i < n; i++) order[i] = (keys[i] as number) % n;
    return order;
  }
  const idx = Array.from({ length: n }, (_, i) => i);
  idx.sort(
    (a, b) =>
      (p[a * stride + at - 1] as number) - (p[b * stride + at - 1] as number) ||
      (p[a * stride + at] as number) - (p[b * stride + at] as number) ||
      a - b,
  );
  order.set(idx);
  return order;
}

/** True when the range at b continues the range at a on both sides (packed; a, b index p). */
function continues(p: Float64Array, a: number, b: number): boolean {
  return continues2(p, a, p, b);
}

/** True when range b of `q` continues range a of `p` on both sides (same slabs, both offsets continue). */
function continues2(p: Float64Array, a: number, q: Float64Array, b: number): boolean {
  return (
    p[a] === q[b] &&
    p[a + 2] === q[b + 2] &&
    (p[a + 3] as number) + (p[a + 4] as number) === q[b + 3] &&
    (p[a + 1] as number) + (p[a + 4] as number) === q[b + 1]
  );
}

/**
 * Merge packed ranges that are contiguous on both sides (same slab, remote and local both continue),
 * in (slab, remoteOffset) order. Bytes and their local<->remote mapping are preserved. Ranges already in
 * order with nothing to merge come back as `p` itself (scattered pages: no second array to allocate).
 */
export function coalescePacked(p: Float64Array, into?: Float64Array): Float64Array {
  assert(p.length % PACKED_STRIDE === 0, 'packed ranges come in fives');
  const order = orderBy(sideOf(p, 'remote'));
  const n = p.length / PACKED_STRIDE;
  if (order === null) {
    let merges = 0;
    for (let j = PACKED_STRIDE; j < p.length; j += PACKED_STRIDE) if (continues(p, j - PACKED_STRIDE, j)) merges++;
    for (let j = 4; j < p.length; j += PACKED_STRIDE) assert((p[j] as number) > 0, 'coalesceRanges: zero-length range');
    if (merges === 0) return p;
  }
  const reuse = into !== undefined && into.length >= p.length && into.buffer !== p.buffer;
  const out = reuse ? into : new Float64Array(p.length);
  let k = -PACKED_STRIDE;
  for (let i = 0; i < n; i++) {
    const j = (order === null ? i : (order[i] as number)) * PACKED_STRIDE;
    assert((p[j + 4] as number) > 0, 'coalesceRanges: zero-length range');
    if (k >= 0 && continues2(out, k, p, j)) {
      out[k + 4] = (out[k + 4] as number) + (p[j + 4] as number);
      continue;
    }
    k += PACKED_STRIDE;
    for (let f = 0; f < PACKED_STRIDE; f++) out[k + f] = p[j + f] as number;
  }
  return reuse ? out.subarray(0, k + PACKED_STRIDE) : out.slice(0, k + PACKED_STRIDE);
}

/** `p` (packed ranges) in (slab, offset) order of one side: the order a receiver wants its stream in. */
export function sortedBy(p: Float64Array, side: 'local' | 'remote'): Float64Array {
  const order = orderBy(sideOf(p, side));
  if (order === null) return p;
  const out = new Float64Array(p.length);
  order.forEach((i, k) => out.set(p.subarray(i * PACKED_STRIDE, (i + 1) * PACKED_STRIDE), k * PACKED_STRIDE));
  return out;
}

/**
 * Cut packed ranges, in their order, into `parts` pieces of (nearly) equal bytes, splitting a range where
 * a cut falls inside it: one work request carried by several connections. Fewer pieces when there are
 * fewer bytes than `parts`.
 */
export function splitPacked(p: Float64Array, parts: number): Float64Array[] {
  assert(Number.isInteger(parts) && parts >= 1, 'splitPacked: parts must be a positive integer');
  const total = sideBytes(sideOf(p, 'local'));
  const n = Math.max(1, Math.min(parts, total));
  const out: Float64Array[] = [];
  let piece: number[] = [];
  let done = 0;
  for (let j = 0; j < p.length; j += PACKED_STRIDE) {
    const [slab, local, remoteSlab, remote] = [
      p[j] as number,
      p[j + 1] as number,
      p[j + 2] as number,
      p[j + 3] as number,
    ];
    let length = p[j + 4] as number;
    let at = 0;
    while (length > 0) {
      const cut = Math.floor(((out.length + 1) * total) / n);
      const take = Math.min(length, cut - done);
      piece.push(slab, local + at, remoteSlab, remote + at, take);
      [at, length, done] = [at + take, length - take, done + take];
      if (done === cut && out.length < n - 1) {
        out.push(Float64Array.from(piece));
        piece = [];
      }
    }
  }
  out.push(Float64Array.from(piece));
  return out;
}

/** coalescePacked over objects (same order and result). */
export function coalesceRanges(ranges: readonly TransferRange[]): TransferRange[] {
  return unpackRanges(coalescePacked(packRanges(ranges)));
}

/** Above this many ranges the whole-page check uses the page bitmap (disjointPages), below it a sort. */
const BITMAP_MIN_RANGES = 64;

/**
 * True when no two ranges of one side overlap (same slab, intersecting bytes). `bitmap`: a zeroed buffer
 * of at least numSlabs * numBlocks bytes to reuse (left zeroed).
 */
export function disjointSide(
  side: SideRanges,
  layout?: SlabLayout,
  bitmap?: Uint8Array,
  bitmapMinRanges = BITMAP_MIN_RANGES,
): boolean {
  const { p, stride, at } = side;
  // The page bitmap pays per page, the sort per range: a few long ranges are cheaper sorted.
  if (layout !== undefined && sideCount(side) > bitmapMinRanges) {
    const pages = disjointPages(side, layout, bitmap);
    if (pages !== null) return pages;
  }
  const order = orderBy(side);
  const n = sideCount(side);
  let prev = -1;
  for (let i = 0; i < n; i++) {
    const j = (order === null ? i : (order[i] as number)) * stride;
    if (
      prev >= 0 &&
      p[prev + at - 1] === p[j + at - 1] &&
      (p[prev + at] as number) + (p[prev + stride - 1] as number) > (p[j + at] as number)
    )
      return false;
    prev = j;
  }
  return true;
}

/**
 * Whole-page ranges (the common case: KV pages) are checked with a bitmap of the layout's pages instead
 * of a sort: true/false, or null when some range is not whole pages inside the layout.
 */
function disjointPages(side: SideRanges, layout: SlabLayout, bitmap?: Uint8Array): boolean | null {
  const { p, stride, at } = side;
  const { pageBytes, numBlocks, numSlabs } = layout;
  for (let j = 0; j < p.length; j += stride) {
    const offset = p[j + at] as number;
    const length = p[j + stride - 1] as number;
    if (offset % pageBytes !== 0 || length % pageBytes !== 0 || !((p[j + at - 1] as number) < numSlabs)) return null;
    if (offset + length > numBlocks * pageBytes) return null;
  }
  const seen =
    bitmap !== undefined && bitmap.length >= numSlabs * numBlocks ? bitmap : new Uint8Array(numSlabs * numBlocks);
  let ok = true;
  let j = 0;
  for (; j < p.length && ok; j += stride) {
    const first = (p[j + at - 1] as number) * numBlocks + (p[j + at] as number) / pageBytes;
    const end = first + (p[j + stride - 1] as number) / pageBytes;
    for (let b = first; b < end; b++) {
      if (seen[b] === 1) ok = false;
      seen[b] = 1;
    }
  }
  // Leave a reused bitmap zeroed: clear exactly the pages marked.
  if (seen === bitmap) {
    for (let k = 0; k < j; k += stride) {
      const first = (p[k + at - 1] as number) * numBlocks + (p[k + at] as number) / pageBytes;
      seen.fill(0, first, first + (p[k + stride - 1] as number) / pageBytes);
    }
  }
  return ok;
}

/** disjointSide over objects. */
export function disjoint(ranges: readonly WireRange[]): boolean {
  return disjointSide(sideOfWire(ranges));
}

function isNonNegInt(x: number): boolean {
  return Number.isSafeInteger(x) && x >= 0;
}

/** Why a range does not fit the layout, or null. */
export function rangeProblemAt(slab: number, offset: number, length: number, layout: SlabLayout): string | null {
  if (!isNonNegInt(slab) || slab >= layout.numSlabs) return `slab ${slab} out of range (numSlabs ${layout.numSlabs})`;
  if (!isNonNegInt(offset) || !isNonNegInt(length) || length === 0)
    return `bad range offset ${offset} length ${length}`;
  const slabBytes = layout.numBlocks * layout.pageBytes;
  if (offset + length > slabBytes) return `range [${offset}, ${offset + length}) beyond slab end ${slabBytes}`;
  return null;
}

export function rangeProblem(r: WireRange, layout: SlabLayout): string | null {
  return rangeProblemAt(r.slab, r.offset, r.length, layout);
}

/** The first range of `side` that does not fit the layout, as its problem, or null. */
export function sideProblem(side: SideRanges, layout: SlabLayout): string | null {
  const { p, stride, at } = side;
  for (let j = 0; j < p.length; j += stride) {
    const problem = rangeProblemAt(p[j + at - 1] as number, p[j + at] as number, p[j + stride - 1] as number, layout);
    if (problem !== null) return problem;
  }
  return null;
}

/**
 * A set of page ids as sorted, maximal runs [start, end): a grant's pages. Checking that a range's pages
 * are all in it is one binary search per range, not one set lookup per page (a 64 MiB READ of 32 KiB
 * pages is 2,048 pages in two ranges).
 */
export class PageRuns {
  private readonly runs: Int32Array;

  constructor(pages: Iterable<number>) {
    const sorted = [...new Set(pages)].sort((a, b) => a - b);
    const runs: number[] = [];
    for (const b of sorted) {
      if (runs.length > 0 && runs[runs.length - 1] === b) runs[runs.length - 1] = b + 1;
      else runs.push(b, b + 1);
    }
    this.runs = Int32Array.from(runs);
  }

  /** The first page of [first, last] not in the set, or null when all are. */
  firstOutside(first: number, last: number): number | null {
    const r = this.runs;
    let [lo, hi] = [0, r.length / 2 - 1];
    let k = -1; // the last run starting at or before `first`
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if ((r[2 * mid] as number) <= first) [k, lo] = [mid, mid + 1];
      else hi = mid - 1;
    }
    if (k < 0 || (r[2 * k + 1] as number) <= first) return first;
    const end = r[2 * k + 1] as number; // runs are maximal: `end` itself is not in the set
    return last < end ? null : end;
  }
}

/** Every page of the range [offset, offset + length) lies in `pages`: null, else the first page that does not. */
export function firstPageOutside(offset: number, length: number, pageBytes: number, pages: PageRuns): number | null {
  return pages.firstOutside(Math.floor(offset / pageBytes), Math.floor((offset + length - 1) / pageBytes));
}

/** The local and remote sides of a request as wire ranges, in the same order. */
export function localSide(ranges: readonly TransferRange[]): WireRange[] {
  return ranges.map((r) => ({ slab: r.slab, offset: r.localOffset, length: r.length }));
}
export function remoteSide(ranges: readonly TransferRange[]): WireRange[] {
  return ranges.map((r) => ({ slab: r.remoteSlab ?? r.slab, offset: r.remoteOffset, length: r.length }));
}

export { RangeStream } from './range_stream.ts';
