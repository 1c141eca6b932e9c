/**
 * The plain-TS matmul yardstick of `handoff bench model` (bench.ts): the lm head's shape, dot products
 * against pre-transposed f32 weights, the model's own matVec. Also the `matmul` kernel (kernels.ts), so
 * the bench can see what N compute threads running it side by side give the machine.
 */
import { matVec, type FlopCounter, type Linear } from './ops.ts';

/** The roofline's operands: 64 inputs, 8192 outputs (the lm head's shape, in L2). */
export function rooflineOperands(): { lin: Linear; x: Float64Array; out: Float64Array } {
  const rows = 8192;
  const cols = 64;
  const w = new Float32Array(rows * cols);
  for (let i = 0; i < w.length; i++) w[i] = ((i * 2654435761) % 1000) / 1000 - 0.5;
  return { lin: { rows, cols, w }, x: new Float64Array(cols).map((_, i) => Math.cos(i)), out: new Float64Array(rows) };
}

/** `reps` roofline products (the `matmul` kernel: what a thread computes when nothing else holds it). */
export function rooflineWork(reps: number): number {
  const { lin, x, out } = rooflineOperands();
  const fc: FlopCounter = { flops: 0 };
  for (let r = 0; r < reps; r++) {
    matVec(lin, x, 0, out, 0, fc);
    x[r % lin.cols] = out[r % lin.rows] as number;
  }
  return fc.flops;
}
