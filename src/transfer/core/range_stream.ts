/**
 * A transfer's byte stream over its ranges (one side of them): where each stream byte goes, for the tcp
 * sender (gathering DATA frames) and receivers (placing pieces, or peeking the segments readv fills).
 */
import { assert } from '../../util/assert.ts';
import { sideBytes, type SideRanges } from './ranges.ts';

/**
 * Maps positions of a transfer's byte stream to (range, offset). Pieces must arrive in order
 * (`expected` is the next stream offset), as they do over one ordered connection.
 */
export class RangeStream {
  readonly total: number;
  private readonly p: Float64Array;
  private readonly stride: number;
  private readonly at: number;
  /** Index into p of the current range. */
  private j = 0;
  private inRange = 0;
  expected = 0;

  constructor(readonly side: SideRanges) {
    this.total = sideBytes(side);
    ({ p: this.p, stride: this.stride, at: this.at } = side);
  }

  get complete(): boolean {
    return this.expected === this.total;
  }

  /**
   * Where the next stream bytes go: slab, offset, and how many bytes from there are one run of that slab
   * (the current range's rest, extended over the following ranges while they continue it on this side),
   * looked at up to `max` bytes. Length 0 at the end.
   */
  segment(max = Number.MAX_SAFE_INTEGER): { slab: number; offset: number; length: number } {
    if (this.complete) return { slab: 0, offset: 0, length: 0 };
    const { p, j, stride, at } = this;
    const slab = p[j + at - 1] as number;
    const offset = (p[j + at] as number) + this.inRange;
    let length = (p[j + stride - 1] as number) - this.inRange;
    for (let k = j + stride; k < p.length && length < max; k += stride) {
      if (p[k + at - 1] !== slab || p[k + at] !== offset + length) break;
      length += p[k + stride - 1] as number;
    }
    return { slab, offset, length };
  }

  /**
   * The slab segments of the next stream bytes, without moving: up to `maxSegs` (slab, offset, length)
   * triples into `out` (neighbouring ranges merged, as segment() does), covering at most `maxBytes`.
   * Returns how many triples and how many bytes they cover.
   */
  peekSegments(out: Float64Array, maxSegs: number, maxBytes: number): { count: number; bytes: number } {
    assert(out.length >= 3 * maxSegs, 'RangeStream.peekSegments: out too short');
    const { p, stride, at } = this;
    let count = 0;
    let bytes = 0;
    let inRange = this.inRange;
    for (let k = this.j; k < p.length && bytes < maxBytes; k += stride) {
      const slab = p[k + at - 1] as number;
      const offset = (p[k + at] as number) + inRange;
      const length = Math.min((p[k + stride - 1] as number) - inRange, maxBytes - bytes);
      inRange = 0;
      const last = 3 * (count - 1);
      if (count > 0 && out[last] === slab && (out[last + 1] as number) + (out[last + 2] as number) === offset) {
        out[last + 2] = (out[last + 2] as number) + length;
      } else {
        if (count === maxSegs) break;
        out[3 * count] = slab;
        out[3 * count + 1] = offset;
        out[3 * count + 2] = length;
        count++;
      }
      bytes += length;
    }
    return { count, bytes };
  }

  /** Visit the slab segments of the next `length` stream bytes: fn(slab, slabOffset, pieceOffset, segLength). */
  advance(
    length: number,
    fn: (slab: number, slabOffset: number, pieceOffset: number, segLength: number) => void,
  ): void {
    assert(this.expected + length <= this.total, 'RangeStream: advance past the end');
    const { p, stride, at } = this;
    let done = 0;
    while (done < length) {
      assert(this.j < p.length, 'RangeStream: ran out of ranges');
      const rangeLength = p[this.j + stride - 1] as number;
      const seg = Math.min(rangeLength - this.inRange, length - done);
      fn(p[this.j + at - 1] as number, (p[this.j + at] as number) + this.inRange, done, seg);
      done += seg;
      this.inRange += seg;
      if (this.inRange === rangeLength) {
        this.j += stride;
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
