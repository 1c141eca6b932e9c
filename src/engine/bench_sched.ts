/**
 * `handoff bench sched`: host time of schedule() + buildConnectorMeta (+ updateFromOutput) per step on a
 * decode instance with 64 and 256 running requests, one of which is admitted with a READ each step
 * (so the zeroing exclusion runs), as a fraction of one model decode step measured in the same run.
 */
import type { Env } from '../util/env.ts';
import { SimEnv } from '../util/env.ts';
import { KVCacheManager } from '../kv/kv_cache_manager.ts';
import { presetKVGroups, type ModelPreset } from '../kv/presets.ts';
import { makeKVCacheConfig, type KVCacheConfig } from '../kv/spec.ts';
import { createModel } from '../model/model.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from '../connector/config.ts';
import { OneSidedConnectorScheduler } from '../connector/one_sided_scheduler.ts';
import { emptyConnectorOutput } from '../worker/scheduler_output.ts';
import { Request } from './request.ts';
import { DEFAULT_SCHEDULER_CONFIG, Scheduler } from './scheduler.ts';

export interface SchedBenchRow {
  running: number;
  schedMsPerStep: number;
  /** One decode token of one request through the model (measured). */
  tokenStepMs: number;
  /**
   * The model step of this batch: `running` decode tokens (the model computes requests one by one, so it is linear).
   */
  modelStepMs: number;
  fractionOfModelStep: number;
  fractionOfTokenStep: number;
}

function measureModelStepMs(preset: ModelPreset, env: Env): number {
  const kvConfig = makeKVCacheConfig(presetKVGroups(preset), 64);
  const model = createModel(preset, 0, kvConfig);
  const slabs = Array.from(
    { length: kvConfig.numSlabs },
    () => new Uint8Array(kvConfig.numBlocks * kvConfig.pageBytes),
  );
  const tables = kvConfig.groups.map((g) => (g.spec.type === 'mamba' ? [9] : [1, 2]));
  const run = (tokens: number[], start: number): void =>
    void model.forward(
      {
        step: 0,
        requests: [
          {
            requestId: 'b',
            tokenIds: tokens,
            startPos: start,
            blockTables: tables,
            sample: true,
            sampling: { temperature: 0, seed: 0, outputIndex: 0 },
          },
        ],
      },
      slabs,
    );
  run(
    Array.from({ length: 16 }, (_, i) => i + 1),
    0,
  );
  const n = 20;
  const t0 = env.nowMs();
  for (let i = 0; i < n; i++) run([7], 16);
  return (env.nowMs() - t0) / n;
}

/** A decode-side scheduler sized for `running` requests, with a one-sided consumer connector. */
function makeBenchScheduler(preset: ModelPreset, running: number): { sched: Scheduler; kvConfig: KVCacheConfig } {
  const simEnv = new SimEnv(1);
  const kvConfig = makeKVCacheConfig(presetKVGroups(preset), running * 8 + 64);
  const kv = new KVCacheManager(kvConfig, { enableCaching: true });
  const conn = new OneSidedConnectorScheduler(
    { ...DEFAULT_ONE_SIDED_CONFIG, role: 'consumer' },
    kvConfig,
    simEnv,
    { engineId: 'd', host: 'h', port: 1 },
    null,
  );
  const sched = new Scheduler(
    { ...DEFAULT_SCHEDULER_CONFIG, maxNumSeqs: running + 1, maxNumBatchedTokens: running * 64, maxModelLen: 4096 },
    kv,
    conn,
    simEnv,
  );
  return { sched, kvConfig };
}

/** Adds request `r${id}`; with `params`, it loads its prompt from a remote prefill (a READ admission). */
function addBenchRequest(sched: Scheduler, kvConfig: KVCacheConfig, id: number, params: boolean): void {
  const numTokens = 40;
  const remote = kvConfig.groups.map((g, k) =>
    g.spec.type === 'mamba' ? [5000 + id] : [10_000 + id * 8 + k * 4, 10_001 + id * 8 + k * 4, 10_002 + id * 8 + k * 4],
  );
  sched.addRequest(
    new Request({
      requestId: `r${id}`,
      promptTokenIds: Array.from({ length: numTokens }, (_, i) => (id * 37 + i) % 50000),
      sampling: { maxTokens: 4000, temperature: 0, seed: 0, stopTokenIds: [], ignoreEos: true },
      kvTransferParams: params
        ? {
            do_remote_prefill: true,
            remote_engine_id: 'p',
            remote_host: 'h',
            remote_port: 1,
            remote_block_ids: remote,
            transfer_id: `t${id}`,
            grant: 'ab'.repeat(16),
          }
        : null,
      arrivalMs: 0,
    }),
  );
}

/** One scheduler step whose every sampling request samples token 5. */
function benchStep(sched: Scheduler): void {
  const so = sched.schedule();
  const sampled = Object.keys(so.sampleAfter).map((requestId) => ({
    requestId,
    tokenId: 5,
    logprob: null,
    logitsHash: null,
    nanLogits: false,
  }));
  sched.updateFromOutput(so, { step: so.step, sampled, kvConnectorOutput: emptyConnectorOutput() });
}

/** Mean scheduler time per step with `running` requests decoding, one READ admission per step. */
function measureSchedMsPerStep(preset: ModelPreset, env: Env, running: number, steps: number): number {
  const { sched, kvConfig } = makeBenchScheduler(preset, running);
  let next = 0;
  for (let i = 0; i < running; i++) addBenchRequest(sched, kvConfig, next++, false);
  for (let i = 0; i < 5; i++) benchStep(sched); // prefill and warm up
  let total = 0;
  for (let i = 0; i < steps; i++) {
    addBenchRequest(sched, kvConfig, next++, true); // one READ admission per step: the exclusion path runs
    const t0 = env.nowMs();
    benchStep(sched);
    total += env.nowMs() - t0;
  }
  return total / steps;
}

export function benchSched(opts: {
  preset: ModelPreset;
  env: Env;
  runningCounts?: number[];
  steps?: number;
}): SchedBenchRow[] {
  const tokenStepMs = measureModelStepMs(opts.preset, opts.env);
  return (opts.runningCounts ?? [64, 256]).map((running) => {
    const schedMsPerStep = measureSchedMsPerStep(opts.preset, opts.env, running, opts.steps ?? 50);
    const modelStepMs = tokenStepMs * running;
    return {
      running,
      schedMsPerStep,
      tokenStepMs,
      modelStepMs,
      fractionOfModelStep: schedMsPerStep / modelStepMs,
      fractionOfTokenStep: schedMsPerStep / tokenStepMs,
    };
  });
}
