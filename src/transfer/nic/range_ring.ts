/**
 * Where the host puts a work request's packed ranges for its NIC thread: a ring in a SharedArrayBuffer.
 * Posting a view of shared memory costs a small message (~10 us on the dev VM); cloning 64 KiB of ranges
 * cost ~800 us and transferring a fresh buffer ~250 us plus its allocation.
 *
 *   [ free | wr 7 | wr 8 (done) | wr 9 | free ]    regions are handed out in order and released in any
 *            ^head                     ^tail        order; the head moves past released ones.
 *
 * A region stays untouched until release(), which the host calls when it saw the work request end (the
 * NIC reads it only while the work request is pending). When the ring is full, alloc() returns null
 * and the caller sends its own copy instead.
 */
import { assert } from '../../util/assert.ts';

export interface RingRegion {
  start: number;
  end: number;
  released: boolean;
}

export class RangeRing {
  private readonly buf: Float64Array;
  private readonly live: RingRegion[] = [];
  private tail = 0;

  constructor(capacityDoubles: number) {
    assert(Number.isInteger(capacityDoubles) && capacityDoubles > 0, 'ring capacity must be a positive integer');
    this.buf = new Float64Array(new SharedArrayBuffer(capacityDoubles * 8));
  }

  /** A copy of `p` in shared memory, or null when the ring has no room for it now. */
  alloc(p: Float64Array): { view: Float64Array; region: RingRegion } | null {
    const n = Math.max(p.length, 1);
    const cap = this.buf.length;
    const head = this.live[0]?.start ?? null;
    let start: number;
    // A work request larger than the whole ring (up to DESCRIPTORS_MAX ranges of 5 doubles) never fits.
    if (n > cap) return null;
    if (head === null) start = 0;
    else if (this.tail > head || (this.tail === head && this.live.length === 0)) {
      if (this.tail + n <= cap) start = this.tail;
      else if (n < head) start = 0;
      else return null;
    } else if (this.tail + n < head) start = this.tail;
    else return null;
    const region = { start, end: start + n, released: false };
    this.live.push(region);
    this.tail = region.end;
    const view = this.buf.subarray(start, start + p.length);
    view.set(p);
    return { view, region };
  }

  release(region: RingRegion): void {
    assert(!region.released, 'ring region released twice');
    region.released = true;
    while (this.live[0]?.released === true) this.live.shift();
    if (this.live.length === 0) this.tail = 0;
  }

  get regionsInUse(): number {
    return this.live.filter((r) => !r.released).length;
  }
}
