/**
 * Test kit for scheduler tests: builds a scheduler over a real KVCacheManager and connector, and a fake
 * worker that "samples" a deterministic token for every request the step samples. Not used by
 * production code; the real worker is src/worker/model_runner.ts.
 */
import { SimEnv } from '../util/env.ts';
import { KVCacheManager } from '../kv/kv_cache_manager.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import { presetKVGroups, type ModelPreset } from '../kv/presets.ts';
import { NullConnector, type ConnectorScheduler } from '../connector/base.ts';
import {
  emptyConnectorOutput,
  type KVConnectorOutput,
  type ModelRunnerOutput,
  type SchedulerOutput,
} from '../worker/scheduler_output.ts';
import { DEFAULT_SCHEDULER_CONFIG, Scheduler, type SchedulerConfig } from './scheduler.ts';
import { Request } from './request.ts';
import type { KVTransferParams } from '../connector/params.ts';
import type { EngineCreateConfig } from './llm_engine.ts';

export function makeScheduler(opts: {
  preset?: ModelPreset;
  numBlocks?: number;
  config?: Partial<SchedulerConfig>;
  connector?: (env: SimEnv, kv: KVCacheManager) => ConnectorScheduler;
  env?: SimEnv;
}): { scheduler: Scheduler; kv: KVCacheManager; env: SimEnv } {
  const env = opts.env ?? new SimEnv(7);
  const kvConfig = makeKVCacheConfig(presetKVGroups(opts.preset ?? 'dsv4-mini'), opts.numBlocks ?? 64);
  const config = { ...DEFAULT_SCHEDULER_CONFIG, ...opts.config };
  const kv = new KVCacheManager(kvConfig, { enableCaching: config.enablePrefixCaching });
  const connector = opts.connector ? opts.connector(env, kv) : new NullConnector();
  return { scheduler: new Scheduler(config, kv, connector, env), kv, env };
}

let nextId = 0;
export function makeRequest(
  numPromptTokens: number,
  maxTokens: number,
  params: KVTransferParams | null = null,
  id = `req-${nextId++}`,
  firstToken = 1,
): Request {
  return new Request({
    requestId: id,
    promptTokenIds: Array.from({ length: numPromptTokens }, (_, i) => firstToken + i),
    sampling: { maxTokens, temperature: 0, seed: 0, stopTokenIds: [], ignoreEos: true },
    kvTransferParams: params,
    arrivalMs: 0,
  });
}

/** A worker that samples token (1000 + step) for every request that samples this step. */
export function fakeRun(so: SchedulerOutput, conn: Partial<KVConnectorOutput> = {}): ModelRunnerOutput {
  const failed = new Set(conn.failedLoadReqIds ?? []);
  const sampled = Object.entries(so.sampleAfter)
    .filter(([id, s]) => s && !failed.has(id))
    .map(([requestId]) => ({ requestId, tokenId: 1000 + so.step, logprob: null, logitsHash: null, nanLogits: false }));
  return { step: so.step, sampled, kvConnectorOutput: { ...emptyConnectorOutput(), ...conn } };
}

/** `n` prompt token ids spread over the vocabulary, different for each `base`. */
export const spreadPrompt = (n: number, base: number): number[] =>
  Array.from({ length: n }, (_, i) => (base * 131 + i * 7919) % 50000);

/** A small dsv4-mini engine with async scheduling (engine tests), on the given device. */
export function smallEngineConfig(makeDevice: EngineCreateConfig['makeDevice']): EngineCreateConfig {
  return {
    preset: 'dsv4-mini',
    modelSeed: 1,
    numBlocks: 96,
    asyncScheduling: true,
    scheduler: { maxNumBatchedTokens: 256, maxNumSeqs: 8 },
    idlePollMs: 2,
    makeDevice,
  };
}
