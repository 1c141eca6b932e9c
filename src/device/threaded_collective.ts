/**
 * The ranks of a threaded device meet here while a kernel runs on each of them: an all-gather over
 * shared memory (SharedArrayBuffer + Atomics), a failure flag, and a per-unit agreement barrier.
 *
 *   data (f64): [ buffer 0: rank 0 slot | rank 1 slot | ... ][ buffer 1: the same ]   slotValues each
 *   ctrl (i32): GEN ARRIVED ABORTED AGREE_GEN AGREE_ARRIVED AGREE_FAILED AGREE_RESULT[2] LEFT FENCE_GEN FENCE_ARRIVED
 *
 * allGather: write my piece into my slot of the current buffer, barrier, copy every rank's slot out in
 * rank order. Buffers alternate per call, so one barrier per piece suffices: a rank writes buffer b again
 * two calls later, and every rank has read it by then (it passed the barrier in between). Values longer
 * than a slot move in pieces. The collective moves bytes only; the model adds them, in shard order.
 *
 * Failure: a rank whose unit of work (one request's forward) throws calls abort(); ranks waiting in, or
 * entering, a barrier throw CollectiveAborted; every rank then meets in agree(), which tells all of them
 * that the unit failed and resets the barrier for the next unit. A rank whose whole kernel throws, outside
 * any unit, leave()s: it will not come to the op's remaining barriers and agreements, so the others stop
 * waiting for it (barriers throw, agreements say failed). Every rank ends each kernel op in fence(), which
 * resets all of that for the next op. Every wait is bounded (WAIT_SLICES_MAX).
 */
import { assert } from '../util/assert.ts';
import type { RankCollective } from './types.ts';

const GEN = 0;
const ARRIVED = 1;
const ABORTED = 2;
const AGREE_GEN = 3;
const AGREE_ARRIVED = 4;
const AGREE_FAILED = 5;
const AGREE_RESULT = 6;
const LEFT = 8;
const FENCE_GEN = 9;
const FENCE_ARRIVED = 10;
const CTRL_WORDS = 11;

/** Values per rank slot: one gather of a mini preset's vocabulary shard (25,129 logits) fits in one piece. */
export const COLLECTIVE_SLOT_VALUES = 32_768;
/** Busy polls before sleeping on a futex: the other rank usually arrives within microseconds. */
const SPINS = 4_000;
const WAIT_SLICE_MS = 50;
/** 60 s: a rank that never arrives (a dead thread) fails the kernel instead of hanging it. */
const WAIT_SLICES_MAX = 1_200;

/** Shared memory of one device's collective, created by the host and handed to every rank thread. */
export interface CollectiveInit {
  size: number;
  slotValues: number;
  ctrl: SharedArrayBuffer;
  data: SharedArrayBuffer;
}

export function collectiveInit(size: number, slotValues = COLLECTIVE_SLOT_VALUES): CollectiveInit {
  assert(Number.isInteger(size) && size >= 2, 'a collective joins at least two ranks');
  return {
    size,
    slotValues,
    ctrl: new SharedArrayBuffer(CTRL_WORDS * 4),
    data: new SharedArrayBuffer(2 * size * slotValues * 8),
  };
}

/** A rank gave up the current unit: thrown by the other ranks' barriers until agree(). */
export class CollectiveAborted extends Error {
  constructor(rank: number) {
    super(`rank ${rank}: another tensor parallel rank failed this request`);
  }
}

export class SharedMemoryCollective implements RankCollective {
  readonly size: number;
  private readonly ctrl: Int32Array;
  private readonly data: Float64Array;
  private readonly slot: number;
  private calls = 0;

  constructor(
    init: CollectiveInit,
    readonly rank: number,
  ) {
    assert(Number.isInteger(rank) && rank >= 0 && rank < init.size, `rank ${rank} out of [0, ${init.size})`);
    this.size = init.size;
    this.slot = init.slotValues;
    this.ctrl = new Int32Array(init.ctrl);
    this.data = new Float64Array(init.data);
  }

  allGather(local: Float64Array, out: Float64Array): void {
    const n = local.length;
    assert(out.length === this.size * n, `allGather: out holds ${out.length} values, not ${this.size} x ${n}`);
    for (let off = 0; off < n; off += this.slot) {
      const len = Math.min(this.slot, n - off);
      const buffer = (this.calls++ % 2) * this.size;
      this.data.set(local.subarray(off, off + len), (buffer + this.rank) * this.slot);
      this.barrier();
      for (let r = 0; r < this.size; r++) {
        const at = (buffer + r) * this.slot;
        out.set(this.data.subarray(at, at + len), r * n + off);
      }
    }
  }

  abort(): void {
    Atomics.store(this.ctrl, ABORTED, 1);
    Atomics.notify(this.ctrl, GEN);
  }

  /** This rank's kernel threw outside any unit: it takes no further part in this op (see fence). */
  leave(): void {
    Atomics.store(this.ctrl, LEFT, 1);
    this.abort();
    Atomics.notify(this.ctrl, AGREE_GEN);
  }

  /**
   * The end of a kernel op, on every rank: once all are here none is in a barrier or an agreement, and what
   * a failed op left behind (an abort, a rank that left, half-counted arrivals) is cleared for the next op.
   */
  fence(): void {
    const c = this.ctrl;
    const gen = Atomics.load(c, FENCE_GEN);
    if (Atomics.add(c, FENCE_ARRIVED, 1) === this.size - 1) {
      for (const word of [ARRIVED, ABORTED, AGREE_ARRIVED, AGREE_FAILED, LEFT, FENCE_ARRIVED])
        Atomics.store(c, word, 0);
      Atomics.add(c, FENCE_GEN, 1);
      Atomics.notify(c, FENCE_GEN);
    } else {
      this.waitWhile(FENCE_GEN, gen, null);
    }
    this.calls = 0;
  }

  agree(failed: boolean): boolean {
    const c = this.ctrl;
    if (failed) Atomics.add(c, AGREE_FAILED, 1);
    const gen = Atomics.load(c, AGREE_GEN);
    // A rank that left this op never arrives: the unit failed; fence() clears the counts.
    if (Atomics.load(c, LEFT) !== 0) return true;
    if (Atomics.add(c, AGREE_ARRIVED, 1) === this.size - 1) {
      const any = Atomics.load(c, AGREE_FAILED) > 0 || Atomics.load(c, ABORTED) !== 0;
      Atomics.store(c, AGREE_RESULT + (gen % 2), any ? 1 : 0);
      // Every rank is here, none is in a barrier: reset them for the next unit.
      Atomics.store(c, ARRIVED, 0);
      Atomics.store(c, ABORTED, 0);
      Atomics.store(c, AGREE_FAILED, 0);
      Atomics.store(c, AGREE_ARRIVED, 0);
      Atomics.add(c, AGREE_GEN, 1);
      Atomics.notify(c, AGREE_GEN);
    } else if (!this.waitWhile(AGREE_GEN, gen, LEFT)) {
      return true;
    }
    this.calls = 0;
    return Atomics.load(c, AGREE_RESULT + (gen % 2)) === 1;
  }

  private barrier(): void {
    const c = this.ctrl;
    if (Atomics.load(c, ABORTED) !== 0) throw new CollectiveAborted(this.rank);
    const gen = Atomics.load(c, GEN);
    if (Atomics.add(c, ARRIVED, 1) === this.size - 1) {
      Atomics.store(c, ARRIVED, 0);
      Atomics.add(c, GEN, 1);
      Atomics.notify(c, GEN);
      return;
    }
    if (!this.waitWhile(GEN, gen, ABORTED)) throw new CollectiveAborted(this.rank);
  }

  /**
   * Until ctrl[index] moves off `value` (true), or ctrl[stopWord] is set first (false): spin briefly, then
   * sleep in bounded slices.
   */
  private waitWhile(index: number, value: number, stopWord: number | null): boolean {
    const c = this.ctrl;
    for (let i = 0; i < SPINS; i++) if (Atomics.load(c, index) !== value) return true;
    for (let slices = 0; slices < WAIT_SLICES_MAX; slices++) {
      if (Atomics.load(c, index) !== value) return true;
      if (stopWord !== null && Atomics.load(c, stopWord) !== 0) return false;
      Atomics.wait(c, index, value, WAIT_SLICE_MS);
    }
    assert(false, `rank ${this.rank}: the other tensor parallel ranks did not arrive within 60 s`);
  }
}
