/**
 * The arithmetic the model is made of: matrix-vector products against pre-transposed f32 weights,
 * RMSNorm, RoPE, activations. Activations are JS numbers (f64) in Float64Arrays; weights are f32.
 *
 * Determinism: every reduction runs in one fixed order and JS has no FMA contraction, so the same
 * inputs give bit-identical outputs on any machine and in any thread.
 */
import { assert } from '../util/assert.ts';

/** y = W x with W row-major [rows][cols] (each output is a dot product with one row). */
export interface Linear {
  rows: number;
  cols: number;
  w: Float32Array;
}

/** Counts floating point operations (2 per multiply-add) for the benchmark. */
export interface FlopCounter {
  flops: number;
}

export function matVec(
  lin: Linear,
  x: Float64Array,
  xOff: number,
  out: Float64Array | Float32Array,
  outOff: number,
  fc: FlopCounter,
): void {
  const { rows, cols, w } = lin;
  assert(xOff + cols <= x.length && outOff + rows <= out.length, 'matVec: operand out of range');
  const c4 = cols - (cols % 4);
  for (let r = 0; r < rows; r++) {
    let k = r * cols;
    let s = 0;
    let c = 0;
    // Unrolled by 4 with ONE accumulator: the same order of additions as the plain loop.
    for (; c < c4; c += 4, k += 4) {
      s += (w[k] as number) * (x[xOff + c] as number);
      s += (w[k + 1] as number) * (x[xOff + c + 1] as number);
      s += (w[k + 2] as number) * (x[xOff + c + 2] as number);
      s += (w[k + 3] as number) * (x[xOff + c + 3] as number);
    }
    for (; c < cols; c++, k++) s += (w[k] as number) * (x[xOff + c] as number);
    out[outOff + r] = s;
  }
  fc.flops += 2 * rows * cols;
}

/** out = x / rms(x) * weight, over n values starting at off. */
export function rmsNorm(
  x: ArrayLike<number>,
  off: number,
  n: number,
  weight: Float32Array,
  eps: number,
  out: Float64Array,
  outOff: number,
): void {
  let ss = 0;
  for (let i = 0; i < n; i++) {
    const v = x[off + i] as number;
    ss += v * v;
  }
  const inv = 1 / Math.sqrt(ss / n + eps);
  for (let i = 0; i < n; i++) out[outOff + i] = (x[off + i] as number) * inv * (weight[i] as number);
}

/** Rotate pairs (2i, 2i+1) of v[off .. off+dim) by position pos (rotary embedding). */
export function rope(v: Float64Array, off: number, dim: number, pos: number, theta: number): void {
  assert(dim % 2 === 0, 'rope needs an even dimension');
  for (let i = 0; i < dim / 2; i++) {
    const angle = pos * Math.pow(theta, (-2 * i) / dim);
    const c = Math.cos(angle);
    const s = Math.sin(angle);
    const a = v[off + 2 * i] as number;
    const b = v[off + 2 * i + 1] as number;
    v[off + 2 * i] = a * c - b * s;
    v[off + 2 * i + 1] = a * s + b * c;
  }
}

export function silu(x: number): number {
  return x / (1 + Math.exp(-x));
}

export function softplus(x: number): number {
  return x > 20 ? x : Math.log1p(Math.exp(x));
}

/** A growable scratch buffer, so layers do not allocate per token. */
export class Scratch {
  private buf = new Float64Array(0);
  get(n: number): Float64Array {
    if (this.buf.length < n) this.buf = new Float64Array(Math.max(n, this.buf.length * 2));
    return this.buf;
  }
}
