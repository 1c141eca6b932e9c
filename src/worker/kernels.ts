/**
 * The kernel module the engine's device loads: the model's forward plus what stays "on the device"
 * between steps. With async scheduling the host enqueues step k+1 before it has seen the token step k
 * sampled (like vLLM keeping sampled ids on the GPU), so a decode input of PLACEHOLDER_TOKEN means "the
 * token this request sampled last on this device". The table lives in the stream's executor, and the
 * stream's FIFO order guarantees step k's sample is recorded before step k+1 reads it.
 */
import { assert } from '../util/assert.ts';
import type { KernelFn, KernelRanks, RankCollective } from '../device/types.ts';
import { createModel } from '../model/model.ts';
import type { ForwardArgs, ForwardOutput, ForwardResult, ModelKernelInit } from '../model/types.ts';

export const PLACEHOLDER_TOKEN = -1;

export interface StepArgs extends ForwardArgs {
  /** Requests the engine no longer runs: forget their device-side state. */
  forget: string[];
}

/**
 * The step kernel. Requests are computed one by one (the model is batch invariant), and a request whose
 * forward or sampling throws fails alone, like a device error reported for one sequence: its output
 * carries `error`, the other requests of the step are unaffected, and the engine fails that request with
 * a 500 instead of dying. Its device-side state is dropped, so later steps that still name it (async
 * scheduling enqueued them before the host knew) fail it again rather than compute on a stale token.
 */
export function createStepKernel(
  forward: (args: ForwardArgs, slabs: Uint8Array[]) => ForwardResult,
  /** With tensor parallel ranks in other threads: every request's outcome is agreed on by all of them. */
  collective: RankCollective | null = null,
): KernelFn {
  const lastSampled = new Map<string, number>();
  const failed = new Set<string>();
  return (raw: unknown, slabs: Uint8Array[]) => {
    const args = raw as StepArgs;
    for (const id of args.forget) {
      lastSampled.delete(id);
      failed.delete(id);
    }
    assert(
      new Set(args.requests.map((r) => r.requestId)).size === args.requests.length,
      'a request appears twice in one step',
    );
    const outputs: ForwardOutput[] = [];
    for (const r of args.requests) {
      let out: ForwardOutput | null = null;
      let error: string | null = null;
      try {
        out = forwardOne(r, args.step, slabs, failed, lastSampled, forward);
        // catch-ok: deliberate: a device error for one sequence (its assertions included) is reported on that sequence,
        // not crashed; the step goes on for the others
      } catch (e) {
        error = e instanceof Error ? e.message : String(e);
        collective?.abort();
      }
      // Ranks agree: a request that failed on any rank failed on all (they keep the same state).
      if (collective !== null && collective.agree(error !== null) && error === null)
        error = `request ${r.requestId} failed on another tensor parallel rank`;
      if (out !== null && error === null) {
        if (out.tokenId !== null) lastSampled.set(out.requestId, out.tokenId);
        outputs.push(out);
        continue;
      }
      failed.add(r.requestId);
      lastSampled.delete(r.requestId);
      outputs.push({
        requestId: r.requestId,
        tokenId: null,
        logprob: null,
        logitsHash: null,
        nanLogits: false,
        error: error ?? 'no output',
      });
    }
    return { outputs };
  };
}

/** One request's forward, its placeholder input resolved from the device-side table. */
function forwardOne(
  r: StepArgs['requests'][number],
  step: number,
  slabs: Uint8Array[],
  failed: ReadonlySet<string>,
  lastSampled: ReadonlyMap<string, number>,
  forward: (args: ForwardArgs, slabs: Uint8Array[]) => ForwardResult,
): ForwardOutput {
  assert(!failed.has(r.requestId), `request ${r.requestId} failed in an earlier step on this device`);
  const tokenIds = r.tokenIds.map((t) => {
    if (t !== PLACEHOLDER_TOKEN) return t;
    const last = lastSampled.get(r.requestId);
    assert(last !== undefined, `request ${r.requestId} has no sampled token on the device`);
    return last;
  });
  const out = forward({ step, requests: [{ ...r, tokenIds }] }, slabs).outputs;
  assert(out.length === 1 && out[0]?.requestId === r.requestId, 'a forward of one request returns one output');
  return out[0];
}

export async function createKernels(
  init: ModelKernelInit,
  slabs: Uint8Array[],
  ranks?: KernelRanks,
): Promise<Record<string, KernelFn>> {
  const model = createModel(init.preset, init.seed, init.kvConfig, ranks);
  assert(slabs.length === init.kvConfig.numSlabs, 'device slabs do not match the KV config');
  return { step: createStepKernel((a, s) => model.forward(a, s), ranks?.collective ?? null) };
}
