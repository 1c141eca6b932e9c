/**
 * Deferred free (vLLM #45357): with async scheduling a step scheduled before a request finished or was
 * preempted may still be executing and writing that request's pages. Pages are therefore returned to
 * the pool only once every step scheduled up to the moment of release has been processed.
 *
 *   schedule seq:   ... k   k+1  (release here, fence = k+1)
 *   processed seq:  ... k-1 k    k+1 -> pages freed
 */
import { assert } from '../util/assert.ts';

export class FreeFence {
  private schedSeq = 0;
  private processedSeq = 0;
  private readonly pending: Array<{ fence: number; blocks: number[][] }> = [];

  constructor(private readonly release: (blocks: number[][]) => void) {}

  /** A step was scheduled. */
  scheduled(step: number): void {
    assert(step > this.schedSeq, `steps are scheduled in order (${step} after ${this.schedSeq})`);
    this.schedSeq = step;
  }

  /** A step's output was processed: free every batch whose fence is now passed. */
  processed(step: number): void {
    assert(step >= this.processedSeq, `steps are processed in order (${step} after ${this.processedSeq})`);
    assert(step <= this.schedSeq, 'cannot process a step that was not scheduled');
    this.processedSeq = step;
    while (this.pending.length > 0 && (this.pending[0]?.fence ?? Infinity) <= this.processedSeq) {
      const item = this.pending.shift();
      if (item) this.release(item.blocks);
    }
  }

  /** Free `blocks` once every step scheduled so far has been processed (now, if none is in flight). */
  defer(blocks: number[][]): void {
    if (blocks.every((g) => g.length === 0)) return;
    if (this.processedSeq >= this.schedSeq) {
      this.release(blocks);
      return;
    }
    this.pending.push({ fence: this.schedSeq, blocks });
  }

  get numPending(): number {
    return this.pending.length;
  }
  get inFlightSteps(): number {
    return this.schedSeq - this.processedSeq;
  }
}
