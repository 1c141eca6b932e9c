/**
 * The kernel module the device loads inside its compute-stream thread (DeviceOptions.kernelModuleUrl).
 * `createKernels(init, slabs)` builds the model once; the `forward` kernel then runs a ForwardArgs
 * against the slabs the device passes (SharedArrayBuffer-backed in the threaded device) and returns
 * a plain ForwardResult. `matmul {reps}` runs the bench's roofline products (roofline.ts).
 */
import { assert } from '../util/assert.ts';
import { isModelPreset } from '../kv/presets.ts';
import type { KernelFn, KernelRanks } from '../device/types.ts';
import { rooflineWork } from './roofline.ts';
import { createModel } from './model.ts';
import type { ForwardArgs, ModelKernelInit } from './types.ts';

export async function createKernels(
  init: ModelKernelInit,
  slabs: Uint8Array[],
  ranks?: KernelRanks,
): Promise<Record<string, KernelFn>> {
  assert(typeof init === 'object' && init !== null && isModelPreset(init.preset), 'kernel init needs a model preset');
  const model = createModel(init.preset, init.seed, init.kvConfig, ranks);
  const { numSlabs, numBlocks, pageBytes } = init.kvConfig;
  assert(slabs.length === numSlabs, `device has ${slabs.length} slabs, the KV config ${numSlabs}`);
  for (const s of slabs) assert(s.byteLength === numBlocks * pageBytes, 'slab size does not match the KV config');
  return {
    forward: (args: unknown, kernelSlabs: Uint8Array[]) => model.forward(args as ForwardArgs, kernelSlabs),
    // The bench's yardstick: independent work on every rank (no collective), to see what the threads can give.
    matmul: (args: unknown) => rooflineWork((args as { reps: number }).reps),
  };
}
