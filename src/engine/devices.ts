/**
 * Device factories for an engine: the model's step kernel (src/worker/kernels.ts) runs inside the
 * device's compute stream, in a worker thread (`threaded`) or in process (`sim`).
 */
import { createSimDevice, type SimDevice } from '../device/sim.ts';
import { createThreadedDevice } from '../device/threaded.ts';
import type { Device } from '../device/types.ts';
import type { ModelPreset } from '../kv/presets.ts';
import type { KVCacheConfig } from '../kv/spec.ts';
import * as workerKernels from '../worker/kernels.ts';

export const KERNEL_MODULE_URL = new URL('../worker/kernels.ts', import.meta.url).href;

/** `kernelModuleUrl`: another kernel module exporting createKernels (tests inject device failures this way). */
export function threadedDevice(
  preset: ModelPreset,
  modelSeed: number,
  raceCheck = false,
  kernelModuleUrl = KERNEL_MODULE_URL,
): (kv: KVCacheConfig) => Promise<Device> {
  return (kvConfig) =>
    createThreadedDevice({
      numSlabs: kvConfig.numSlabs,
      numBlocks: kvConfig.numBlocks,
      pageBytes: kvConfig.pageBytes,
      kernelModuleUrl,
      kernelInit: { preset, seed: modelSeed, kvConfig },
      raceCheck,
      tensorParallelSize: kvConfig.tensorParallelSize,
    });
}

/** In-process device whose ops run at the next microtask (tests); the simulator drives its own. */
export function simDevice(
  preset: ModelPreset,
  modelSeed: number,
  opts: { raceCheck?: boolean; autoRun?: boolean; kernelModuleUrl?: string } = {},
): (kv: KVCacheConfig) => Promise<SimDevice> {
  return async (kvConfig) =>
    createSimDevice({
      numSlabs: kvConfig.numSlabs,
      numBlocks: kvConfig.numBlocks,
      pageBytes: kvConfig.pageBytes,
      ...(opts.kernelModuleUrl === undefined ? { kernels: workerKernels } : { kernelModuleUrl: opts.kernelModuleUrl }),
      kernelInit: { preset, seed: modelSeed, kvConfig },
      raceCheck: opts.raceCheck ?? false,
      autoRun: opts.autoRun ?? true,
      tensorParallelSize: kvConfig.tensorParallelSize,
    });
}
