/**
 * Paged attention as real kernels do it (the GQA, MLA and compressor layers are built on it).
 *
 * `attendSlots` scores every slot decoded from the block table's pages. A slot after the query
 * position (causal, or past the sequence) gets its score plus -Infinity, so its weight is exactly 0,
 * and the weighted sum still runs over it: `acc += w * v`. Stale bytes that decode to NaN (or to
 * an infinite value) therefore poison the output, as 0 * NaN = NaN on a GPU too; finite stale bytes
 * contribute exactly 0 and change nothing. Scores are rounded to f32 like a kernel's accumulator,
 * so huge garbage keys overflow to Infinity and poison as well (Inf - Inf = NaN). A set with a tail
 * bound (withTailBound) lets a query skip the masked slots after it when none of them can poison: the
 * result is the same (up to the sign of a zero), and it no longer depends on how many pages the table
 * holds past the query.
 *
 * The softmax max runs over the unmasked slots only (a masked slot is -Infinity), and slots are
 * visited in table order, so a prompt computed in one chunk or several gives bit-identical results.
 */
import { defined } from '../util/assert.ts';
import type { FlopCounter } from './ops.ts';

/** Decoded slots: slot j's key is keys[j*kStride + kOff ..], its value values[j*vStride + vOff ..]. */
export interface SlotSet {
  numSlots: number;
  keys: Float64Array;
  kStride: number;
  kOff: number;
  values: Float64Array;
  vStride: number;
  vOff: number;
  /**
   * Optional (withTailBound): tailBound[j] = the largest |key element| over slots j.., or Infinity if any
   * of those slots has a non-finite key or value element. Lets attendSlots skip masked slots that
   * provably contribute exactly 0.
   */
  tailBound?: Float64Array;
}

/** Scores below this cannot round to an infinite f32 (f32 max is 3.4e38). */
const SAFE_SCORE = 1e38;

/** Fill `bound` (at least numSlots + 1 long) with the tail bounds of `s` and attach it. */
export function withTailBound(s: SlotSet, kDim: number, vDim: number, bound: Float64Array): SlotSet {
  let m = 0;
  bound[s.numSlots] = 0;
  for (let j = s.numSlots - 1; j >= 0; j--) {
    const kb = j * s.kStride + s.kOff;
    for (let d = 0; d < kDim; d++) {
      const a = Math.abs(s.keys[kb + d] as number);
      if (!Number.isFinite(a)) m = Infinity;
      else if (a > m) m = a;
    }
    const vb = j * s.vStride + s.vOff;
    for (let d = 0; d < vDim; d++) if (!Number.isFinite(s.values[vb + d] as number)) m = Infinity;
    bound[j] = m;
  }
  s.tailBound = bound;
  return s;
}

/**
 * How many slots attendSlots must visit for a query at `queryPos`: all of them, or only up to the query
 * when every later (masked) slot has finite values and keys small enough that its f32 score is finite:
 * such a slot's score is exactly -Infinity, its weight exactly 0, and 0 * v adds nothing. A NaN or
 * infinite query, or any doubt, visits every slot.
 */
function slotsToVisit(
  q: Float64Array,
  qOff: number,
  kDim: number,
  s: SlotSet,
  queryPos: number,
  scale: number,
): number {
  const tb = s.tailBound;
  if (tb === undefined || queryPos + 1 >= s.numSlots) return s.numSlots;
  let qAbs = 0;
  for (let d = 0; d < kDim; d++) qAbs += Math.abs(q[qOff + d] as number);
  return qAbs * (tb[queryPos + 1] as number) * scale < SAFE_SCORE ? queryPos + 1 : s.numSlots;
}

/**
 * out[outOff .. outOff+vDim) = softmax(q . k_j * scale, masked j > queryPos) weighted sum of v_j,
 * over all numSlots slots. `probs` is scratch of at least numSlots.
 */
export function attendSlots(
  q: Float64Array,
  qOff: number,
  kDim: number,
  s: SlotSet,
  vDim: number,
  queryPos: number,
  scale: number,
  probs: Float64Array,
  out: Float64Array,
  outOff: number,
  fc: FlopCounter,
): void {
  const n = slotsToVisit(q, qOff, kDim, s, queryPos, scale);
  // Locals, not property loads, in the loops: this is the simulator's hottest function.
  const keys = s.keys;
  const values = s.values;
  const kStride = s.kStride;
  const vStride = s.vStride;
  let kb = s.kOff;
  let max = -Infinity;
  for (let j = 0; j < n; j++, kb += kStride) {
    let dot = 0;
    for (let d = 0; d < kDim; d++) dot += (q[qOff + d] as number) * (keys[kb + d] as number);
    const score = Math.fround(dot * scale) + (j <= queryPos ? 0 : -Infinity);
    probs[j] = score;
    if (score > max) max = score;
  }
  let sum = 0;
  const maskedIsZero = max !== -Infinity;
  for (let j = 0; j < n; j++) {
    const x = probs[j] as number;
    // exp(-Infinity - max) is exactly 0 for any max above -Infinity: masked slots skip the exp (a NaN score,
    // from a NaN key, still goes through it and poisons the sum, as it must).
    const p = x === -Infinity && maskedIsZero ? 0 : Math.exp(x - max);
    probs[j] = p;
    sum += p;
  }
  const outEnd = outOff + vDim;
  for (let o = outOff; o < outEnd; o++) out[o] = 0;
  let vb = s.vOff;
  for (let j = 0; j < n; j++, vb += vStride) {
    const w = probs[j] as number;
    for (let d = 0; d < vDim; d++) out[outOff + d] = (out[outOff + d] as number) + w * (values[vb + d] as number);
  }
  for (let o = outOff; o < outEnd; o++) out[o] = (out[o] as number) / sum;
  fc.flops += n * (2 * kDim + 2 * vDim + 2);
}

/** One request's chunk as the layers see it: hidden states of the chunk's tokens (updated in place). */
export interface Chunk {
  startPos: number;
  hidden: Float64Array[];
  blockTables: number[][];
}

export function blockTable(chunk: Chunk, group: number): number[] {
  return defined(chunk.blockTables[group], `block table of KV group ${group}`);
}
