/**
 * Kernel modules: loaded inside the stream's executor (the worker thread for `threaded`, the process
 * for `sim`), so the device layer never imports the model. A kernel is a plain function over the slabs.
 */
import { assert } from '../util/assert.ts';
import type { KernelFn, KernelModule, KernelRanks } from './types.ts';

export type Kernels = Record<string, KernelFn>;

export function isKernelModule(x: unknown): x is KernelModule {
  return typeof x === 'object' && x !== null && typeof (x as { createKernels?: unknown }).createKernels === 'function';
}

/** Import `url` and call its createKernels(init, slabs, ranks) once. */
export async function loadKernelModule(
  url: string,
  init: unknown,
  slabs: Uint8Array[],
  ranks?: KernelRanks,
): Promise<Kernels> {
  const mod: unknown = await import(url);
  assert(isKernelModule(mod), `kernel module ${url} does not export createKernels`);
  return checkKernels(await mod.createKernels(init, slabs, ranks), url);
}

export function checkKernels(kernels: unknown, from: string): Kernels {
  assert(typeof kernels === 'object' && kernels !== null, `createKernels of ${from} returned no object`);
  for (const [name, fn] of Object.entries(kernels))
    assert(typeof fn === 'function', `kernel '${name}' of ${from} is not a function`);
  return kernels as Kernels;
}

/** The message a failed kernel's ticket rejects with. */
export function kernelFailure(name: string, err: unknown): string {
  const why = err instanceof Error ? err.message : String(err);
  return `kernel '${name}' failed: ${why}`;
}

export function findKernel(kernels: Kernels, name: string): KernelFn {
  const fn = Object.hasOwn(kernels, name) ? kernels[name] : undefined;
  if (fn === undefined) throw new Error(`unknown kernel (have: ${Object.keys(kernels).join(', ') || 'none'})`);
  return fn;
}
