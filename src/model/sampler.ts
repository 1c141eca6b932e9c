/**
 * Turning logits into a token, deterministically.
 *
 * - NaN anywhere: nanLogits = true and the token is the argmax treating NaN as -Infinity (token 0 if
 *   every logit is NaN), whatever the temperature: a poisoned forward is visible, never random.
 * - temperature 0: argmax, lowest index on ties.
 * - temperature > 0: softmax(logits / T), optional top-k then top-p (ties broken by lower index),
 *   and ONE uniform draw from a SeededRng keyed by (seed, outputIndex) only, so a request's tokens do
 *   not depend on the batch it ran in.
 * logprob is the token's log-probability under the raw logits (temperature 1, no filtering).
 */
import { createHash } from 'node:crypto';
import { assert } from '../util/assert.ts';
import { SeededRng } from '../util/env.ts';
import type { SamplingParams } from './types.ts';

export interface SampleResult {
  tokenId: number;
  logprob: number | null;
  nanLogits: boolean;
}

/** sha256 of the logits' bytes (first 128 bits, hex): equal hashes mean equal logits, bit for bit. */
export function logitsHash(logits: Float32Array): string {
  const bytes = new Uint8Array(logits.buffer, logits.byteOffset, logits.byteLength);
  return createHash('sha256').update(bytes).digest('hex').slice(0, 32);
}

/** Argmax with NaN treated as -Infinity and the lowest index winning ties; 0 when nothing beats -Infinity. */
export function argmax(logits: Float32Array): number {
  let best = 0;
  let bestVal = -Infinity;
  for (let i = 0; i < logits.length; i++) {
    const v = logits[i] as number;
    if (v > bestVal) {
      bestVal = v;
      best = i;
    }
  }
  return best;
}

export function hasNaN(logits: Float32Array): boolean {
  for (let i = 0; i < logits.length; i++) if (Number.isNaN(logits[i])) return true;
  return false;
}

function logSumExp(logits: Float32Array, max: number): number {
  let s = 0;
  for (let i = 0; i < logits.length; i++) s += Math.exp((logits[i] as number) - max);
  return max + Math.log(s);
}

/** A 32-bit seed from (seed, outputIndex) only. */
export function drawSeed(seed: number, outputIndex: number): number {
  let h = Math.imul((seed >>> 0) ^ 0x9e3779b9, 0x85ebca6b) >>> 0;
  h = Math.imul(h ^ (Math.floor(seed / 4294967296) >>> 0) ^ (h >>> 15), 0xc2b2ae35) >>> 0;
  h = Math.imul(h ^ (outputIndex >>> 0) ^ (h >>> 13), 0x27d4eb2f) >>> 0;
  return (h ^ (h >>> 16)) >>> 0;
}

/**
 * The largest logits among those still kept (w > 0), sorted descending: every kept logit >= max - delta
 * for the smallest delta in 1/4, 1/2, 1, ..., Infinity whose set satisfies `enough`. That set is
 * always a prefix of the full descending order, so callers get exact results without sorting the
 * whole vocabulary. Ranking uses the logits, never the weights: exp() can map distinct logits to one
 * weight. `maybe(mass)` is a cheap test of a set's weight (summed in index order) before it is sorted:
 * a set it rejects is not sorted (a flat distribution would otherwise sort most of the vocabulary at
 * several deltas). It only saves work: every candidate set is a prefix of the same order, so the
 * prefix `enough` picks in a larger set is the same.
 */
function topLogits(
  logits: Float32Array,
  w: Float64Array,
  max: number,
  maybe: (mass: number) => boolean,
  enough: (desc: Float32Array) => boolean,
): Float32Array {
  for (let delta = 0.25; ; delta = delta < 1e6 ? delta * 2 : Infinity) {
    const floor = max - delta;
    let n = 0;
    let mass = 0;
    for (let i = 0; i < logits.length; i++) {
      const wi = w[i] as number;
      if (wi > 0 && (logits[i] as number) >= floor) {
        n++;
        mass += wi;
      }
    }
    if (delta !== Infinity && !maybe(mass)) continue;
    const desc = new Float32Array(n);
    n = 0;
    for (let i = 0; i < logits.length; i++)
      if ((w[i] as number) > 0 && (logits[i] as number) >= floor) desc[n++] = logits[i] as number;
    desc.sort().reverse();
    if (delta === Infinity || enough(desc)) return desc;
  }
}

/** The k-th largest value of `a` (1 <= k <= a.length), by quickselect; `a` is reordered. */
export function kthLargest(a: Float32Array, k: number): number {
  assert(Number.isInteger(k) && k >= 1 && k <= a.length, `k ${k} outside [1, ${a.length}]`);
  const target = k - 1;
  let lo = 0;
  let hi = a.length - 1;
  while (lo < hi) {
    const pivot = a[(lo + hi) >>> 1] as number;
    let i = lo;
    let j = hi;
    // Hoare partition, descending: a[lo..j] >= pivot, a[i..hi] <= pivot, a[j+1..i-1] == pivot.
    while (i <= j) {
      while ((a[i] as number) > pivot) i++;
      while ((a[j] as number) < pivot) j--;
      if (i <= j) {
        const t = a[i] as number;
        a[i++] = a[j] as number;
        a[j--] = t;
      }
    }
    if (target <= j) hi = j;
    else if (target >= i) lo = i;
    else return pivot;
  }
  return a[target] as number;
}

/** Keep the `count` largest kept logits, given the smallest of them (`cut`); ties at `cut` go to lower indices. */
function keepLargest(logits: Float32Array, w: Float64Array, cut: number, count: number): void {
  let above = 0;
  for (let i = 0; i < logits.length; i++) if ((w[i] as number) > 0 && (logits[i] as number) > cut) above++;
  let ties = count - above;
  for (let i = 0; i < logits.length; i++) {
    const l = logits[i] as number;
    if ((w[i] as number) === 0 || l > cut) continue;
    if (l === cut && ties > 0) ties--;
    else w[i] = 0;
  }
}

/** Keep the k largest logits (ties: lower index first), found by quickselect: no sort of the vocabulary. */
function applyTopK(logits: Float32Array, w: Float64Array, k: number): void {
  let n = 0;
  for (let i = 0; i < logits.length; i++) if ((w[i] as number) > 0) n++;
  if (n <= k) return;
  const kept = new Float32Array(n);
  n = 0;
  for (let i = 0; i < logits.length; i++) if ((w[i] as number) > 0) kept[n++] = logits[i] as number;
  keepLargest(logits, w, kthLargest(kept, k), k);
}

/**
 * Keep the shortest prefix of the (logit desc, index asc) order whose weight reaches topP of the
 * total. A weight is a function of its logit alone, so the sorted logits give the prefix sums.
 */
function applyTopP(
  logits: Float32Array,
  w: Float64Array,
  max: number,
  topP: number,
  weightOf: (logit: number) => number,
): void {
  if (topP >= 1) return;
  let total = 0;
  for (let i = 0; i < w.length; i++) total += w[i] as number;
  const target = topP * total;
  const prefixLength = (desc: Float32Array): number => {
    let cum = 0;
    for (let m = 0; m < desc.length; m++) {
      cum += weightOf(desc[m] as number);
      if (cum >= target) return m + 1;
    }
    return -1;
  };
  const desc = topLogits(
    logits,
    w,
    max,
    (mass) => mass >= target,
    (d) => prefixLength(d) > 0,
  );
  const len = prefixLength(desc);
  if (len > 0) keepLargest(logits, w, desc[len - 1] as number, len);
}

/**
 * softmax(logits / T) weights (unnormalised, max logit 1) after top-k then top-p: 0 for a token filtered
 * out. Exported for the tests, which compare the kept set with a sort-everything reference.
 */
export function keptWeights(logits: Float32Array, p: SamplingParams, max: number): Float64Array {
  const weightOf = (logit: number): number => Math.exp((logit - max) / p.temperature);
  const w = new Float64Array(logits.length);
  for (let i = 0; i < w.length; i++) w[i] = weightOf(logits[i] as number);
  if (p.topK !== undefined && p.topK > 0) applyTopK(logits, w, p.topK);
  if (p.topP !== undefined) applyTopP(logits, w, max, p.topP, weightOf);
  return w;
}

export function sampleToken(logits: Float32Array, p: SamplingParams): SampleResult {
  assert(logits.length > 0, 'no logits to sample from');
  assert(Number.isFinite(p.temperature) && p.temperature >= 0, `bad temperature ${p.temperature}`);
  assert(p.topP === undefined || (p.topP > 0 && p.topP <= 1), `bad topP ${p.topP}`);
  assert(p.topK === undefined || Number.isInteger(p.topK), `bad topK ${p.topK}`);
  const best = argmax(logits);
  if (hasNaN(logits)) return { tokenId: best, logprob: null, nanLogits: true };
  const max = logits[best] as number;
  const lse = logSumExp(logits, max);
  // Infinite logits (an overflowed lm head) have no finite log-probability.
  const logprobOf = (t: number): number | null => {
    const lp = (logits[t] as number) - lse;
    return Number.isFinite(lp) ? lp : null;
  };
  if (p.temperature === 0 || !Number.isFinite(max))
    return { tokenId: best, logprob: logprobOf(best), nanLogits: false };
  const w = keptWeights(logits, p, max);
  let total = 0;
  for (let i = 0; i < w.length; i++) total += w[i] as number;
  const target = new SeededRng(drawSeed(p.seed, p.outputIndex)).next() * total;
  let acc = 0;
  let token = best;
  for (let i = 0; i < w.length; i++) {
    const v = w[i] as number;
    if (v === 0) continue;
    acc += v;
    token = i;
    if (acc > target) break;
  }
  return { tokenId: token, logprob: logprobOf(token), nanLogits: false };
}
