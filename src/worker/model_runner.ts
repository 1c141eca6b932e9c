/**
 * ModelRunner: turns a SchedulerOutput into work on the device, in vLLM V2's order:
 *
 *   1. forget finished/preempted requests, add new ones, append new pages to block tables;
 *   2. updateRequests: zero `newBlockIdsToZero` on the compute stream (queued behind whatever the
 *      stream is still running, e.g. the previous forward), then copy-on-write copies;
 *   3. preForward (connector): post this step's READs from the host and await every one of them;
 *   4. enqueue the forward on the compute stream (never waits for it here);
 *   5. when the forward is done: postForward (connector results) → ModelRunnerOutput.
 *
 * The host returns after step 4, so the engine can schedule and prepare step k+1 while the stream
 * runs step k: the overlap that makes the seed's race real (the zeroing of step k+1 lands after the
 * previous forward, while the NIC writes the READ destinations at once).
 */
import { assert, defined } from '../util/assert.ts';
import type { Device } from '../device/types.ts';
import type { KVCacheConfig } from '../kv/spec.ts';
import { forwardFootprint } from '../model/footprint.ts';
import type { ForwardRequest, ForwardResult } from '../model/types.ts';
import { BlockZeroer } from './block_zeroer.ts';
import type { ConnectorWorkerHooks, LoadResult } from './hooks.ts';
import { PLACEHOLDER_TOKEN, type StepArgs } from './kernels.ts';
import {
  emptyConnectorOutput,
  type ModelRunnerOutput,
  type SamplingParamsData,
  type SchedulerOutput,
} from './scheduler_output.ts';

interface RunnerRequest {
  tokenIds: number[];
  blockTables: number[][];
  sampling: SamplingParamsData;
}

export interface StepHandle {
  /** Resolves when the step's forward has run and the connector reported (never rejects for load failures). */
  output: Promise<ModelRunnerOutput>;
}

export class ModelRunner {
  private readonly reqs = new Map<string, RunnerRequest>();
  readonly zeroer: BlockZeroer | null;
  private forgotten: string[] = [];
  /**
   * Requests whose load failed: left out of every forward until the scheduler rebuilds them (it rolls
   * them back; steps scheduled before it knew may still name them, with inputs that never existed).
   */
  private readonly poisoned = new Set<string>();
  stats = { steps: 0, forwards: 0, pagesZeroed: 0 };

  constructor(
    private readonly device: Device,
    readonly kvConfig: KVCacheConfig,
    private readonly hooks: ConnectorWorkerHooks | null,
    /**
     * Bench/A-B knob: keep the stream busy this long after every forward, as a bigger model's forward
     * would (the GPU measurement's "previous forward still running"). 0 in serving.
     */
    private readonly forwardPadMs = 0,
  ) {
    this.zeroer = kvConfig.needsKvCacheZeroing ? new BlockZeroer(device, kvConfig) : null;
    this.zeroer?.warmup();
  }

  get numRequests(): number {
    return this.reqs.size;
  }

  async executeModel(so: SchedulerOutput): Promise<StepHandle> {
    this.stats.steps++;
    this.applyRequestState(so);
    const zeroFirst = this.hooks?.zeroBeforeLoads ?? true;
    if (zeroFirst) this.enqueueZeroingAndCopies(so);
    // 3. Loads: every READ of this step has landed (or failed) when this returns.
    const loads: LoadResult = this.hooks
      ? await this.hooks.preForward(so)
      : { failedReqIds: [], invalidBlockIds: [], loadErrors: {} };
    if (!zeroFirst) this.enqueueZeroingAndCopies(so);
    for (const id of loads.failedReqIds) this.poisoned.add(id);
    const failed = this.poisoned;
    // 4. The forward.
    const requests = this.buildForwardRequests(so, failed);
    const forward = this.enqueueForward(so, requests);
    // 5. Results. A forward that failed as a whole fails the requests it computed, not the engine.
    const forwardIds = requests.map((r) => r.requestId);
    const output = forward.then(
      (result) => this.collect(so, loads, result),
      (e: unknown) => {
        const error = `the forward of step ${so.step} failed: ${e instanceof Error ? e.message : String(e)}`;
        return this.collect(so, loads, {
          outputs: forwardIds.map((requestId) => ({
            requestId,
            tokenId: null,
            logprob: null,
            logitsHash: null,
            nanLogits: false,
            error,
          })),
        });
      },
    );
    return { output };
  }

  /** 1. Request state: forget finished and preempted requests, take in new ones, extend block tables. */
  private applyRequestState(so: SchedulerOutput): void {
    for (const id of [...so.finishedReqIds, ...so.preemptedReqIds]) {
      this.reqs.delete(id);
      this.poisoned.delete(id);
      this.forgotten.push(id);
    }
    for (const n of so.scheduledNewReqs) {
      this.poisoned.delete(n.requestId);
      this.reqs.set(n.requestId, {
        tokenIds: [...n.tokenIds],
        blockTables: n.blockIds.map((g) => [...g]),
        sampling: n.sampling,
      });
    }
    for (const c of so.scheduledCachedReqs) {
      const r = defined(this.reqs.get(c.requestId), `runner state of ${c.requestId}`);
      c.newBlockIds.forEach((ids, g) => defined(r.blockTables[g], `block table ${g}`).push(...ids));
    }
  }

  /** 2. Zeroing, then copy-on-write, on the compute stream. */
  private enqueueZeroingAndCopies(so: SchedulerOutput): void {
    if (so.newBlockIdsToZero && so.newBlockIdsToZero.length > 0) {
      const zeroer = defined(this.zeroer, 'zero list sent to a cache that needs no zeroing');
      zeroer.zeroBlockIds(so.newBlockIdsToZero, so.step);
      this.stats.pagesZeroed += so.newBlockIdsToZero.length;
    }
    if (so.kvCacheBlockCopies.length > 0) {
      this.device.compute.enqueue({
        op: { kind: 'copy', pairs: so.kvCacheBlockCopies, slabs: [...Array(this.kvConfig.numSlabs).keys()] },
        label: { what: 'cow-copy', step: so.step },
      });
    }
  }

  /** 4. Enqueue the step kernel (when there is anything to compute or forget), then the pad; null if none. */
  private enqueueForward(so: SchedulerOutput, requests: StepArgs['requests']): Promise<ForwardResult | null> {
    // No forward: the output still waits until the stream ran what the step queued (zeroing, copies,
    // clipped tails). The free fence counts a processed step as done on the device: pages freed after it
    // must not be zeroed later by it (an empty step once let a READ into a freed page race its zeroing).
    if (requests.length === 0 && this.forgotten.length === 0)
      return this.device.compute
        .recordEvent()
        .wait()
        .then(() => null);
    const args: StepArgs = { step: so.step, requests, forget: this.forgotten };
    this.forgotten = [];
    this.stats.forwards++;
    const ticket = this.device.compute.enqueue({
      op: { kind: 'kernel', name: 'step', args },
      label: { what: 'forward', step: so.step, requestIds: requests.map((r) => r.requestId) },
      footprint: forwardFootprint(this.kvConfig, args),
    });
    if (this.forwardPadMs > 0) {
      this.device.compute.enqueue({
        op: { kind: 'sleep', ms: this.forwardPadMs },
        label: { what: 'forward-pad', step: so.step },
      });
    }
    return ticket.done as Promise<ForwardResult>;
  }

  private async collect(
    so: SchedulerOutput,
    loads: LoadResult,
    result: ForwardResult | null,
  ): Promise<ModelRunnerOutput> {
    const conn = this.hooks ? await this.hooks.postForward(so) : emptyConnectorOutput();
    const forwardErrors: Record<string, string> = {};
    for (const o of result?.outputs ?? []) if (o.error !== undefined) forwardErrors[o.requestId] = o.error;
    const sampled = (result?.outputs ?? [])
      .filter((o) => o.tokenId !== null && o.error === undefined)
      .map((o) => ({
        requestId: o.requestId,
        tokenId: o.tokenId as number,
        logprob: o.logprob,
        logitsHash: o.logitsHash,
        nanLogits: o.nanLogits,
      }));
    for (const s of sampled) this.reqs.get(s.requestId)?.tokenIds.push(s.tokenId);
    return {
      step: so.step,
      sampled,
      forwardErrors,
      kvConnectorOutput: {
        ...conn,
        failedLoadReqIds: [...conn.failedLoadReqIds, ...loads.failedReqIds],
        invalidBlockIds: [...conn.invalidBlockIds, ...loads.invalidBlockIds],
        loadErrors: { ...conn.loadErrors, ...loads.loadErrors },
      },
    };
  }

  private buildForwardRequests(so: SchedulerOutput, failed: Set<string>): ForwardRequest[] {
    const out: ForwardRequest[] = [];
    const add = (requestId: string, start: number, tokenIds: number[], outputIndex: number): void => {
      if (failed.has(requestId)) return;
      const r = defined(this.reqs.get(requestId), `runner state of ${requestId}`);
      const n = defined(so.numScheduledTokens[requestId], `scheduled tokens of ${requestId}`);
      assert(tokenIds.length === n, `request ${requestId}: ${tokenIds.length} input tokens for ${n} scheduled`);
      out.push({
        requestId,
        tokenIds,
        startPos: start,
        blockTables: r.blockTables.map((g) => [...g]),
        sample: so.sampleAfter[requestId] === true,
        sampling: {
          temperature: r.sampling.temperature,
          topP: r.sampling.topP,
          topK: r.sampling.topK,
          seed: r.sampling.seed,
          outputIndex,
        },
      });
    };
    // Running requests first: the model computes requests one after the other, and a request admitted this
    // step may prefix-hit pages a running request's prefill chunk writes in this same step (the scheduler
    // publishes pages when it allocates them). New requests keep their admission order for the same reason.
    for (const c of so.scheduledCachedReqs) {
      const tokens = c.newTokenIds.length > 0 ? c.newTokenIds : [PLACEHOLDER_TOKEN];
      add(c.requestId, c.numComputedTokens, tokens, c.numOutputTokens);
    }
    for (const n of so.scheduledNewReqs) {
      const count = defined(so.numScheduledTokens[n.requestId], 'scheduled tokens');
      add(
        n.requestId,
        n.numComputedTokens,
        n.tokenIds.slice(n.numComputedTokens, n.numComputedTokens + count),
        n.numOutputTokens,
      );
    }
    return out;
  }
}
