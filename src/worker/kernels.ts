/**
 * The kernel module the engine's device loads: the model's forward plus what stays "on the device"
 * between steps. With async scheduling the host enqueues step k+1 before it has seen the token step k
 * sampled (like vLLM keeping sampled ids on the GPU), so a decode input of PLACEHOLDER_TOKEN means "the
 * token this request sampled last on this device". The table lives in the stream's executor, and the
 * stream's FIFO order guarantees step k's sample is recorded before step k+1 reads it.
 */
import { assert } from '../util/assert.ts';
import type { KernelFn } from '../device/types.ts';
import { createModel } from '../model/model.ts';
import type { ForwardArgs, ForwardResult, ModelKernelInit } from '../model/types.ts';

export const PLACEHOLDER_TOKEN = -1;

export interface StepArgs extends ForwardArgs {
  /** Requests the engine no longer runs: forget their device-side state. */
  forget: string[];
}

export function createStepKernel(forward: (args: ForwardArgs, slabs: Uint8Array[]) => ForwardResult): KernelFn {
  const lastSampled = new Map<string, number>();
  return (raw: unknown, slabs: Uint8Array[]) => {
    const args = raw as StepArgs;
    for (const id of args.forget) lastSampled.delete(id);
    const requests = args.requests.map((r) => ({
      ...r,
      tokenIds: r.tokenIds.map((t) => {
        if (t !== PLACEHOLDER_TOKEN) return t;
        const last = lastSampled.get(r.requestId);
        assert(last !== undefined, `request ${r.requestId} has no sampled token on the device`);
        return last;
      }),
    }));
    const result = forward({ step: args.step, requests }, slabs);
    for (const o of result.outputs) if (o.tokenId !== null) lastSampled.set(o.requestId, o.tokenId);
    return result;
  };
}

export async function createKernels(init: ModelKernelInit, slabs: Uint8Array[]): Promise<Record<string, KernelFn>> {
  const model = createModel(init.preset, init.seed, init.kvConfig);
  assert(slabs.length === init.kvConfig.numSlabs, 'device slabs do not match the KV config');
  return { step: createStepKernel((a, s) => model.forward(a, s)) };
}
