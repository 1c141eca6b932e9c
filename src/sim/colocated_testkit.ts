/**
 * Test kit: the colocated engine P/D pair tests compare with, built as PdPair builds its instances (same
 * model seed, pool and threaded device), each request run alone in turn.
 */
import type { Env } from '../util/env.ts';
import type { ModelPreset } from '../kv/presets.ts';
import { threadedDevice } from '../engine/devices.ts';
import { LLMEngine, type GenerateRequest, type GenerateResult } from '../engine/llm_engine.ts';

export async function colocatedRuns(
  env: Env,
  requests: readonly GenerateRequest[],
  preset: ModelPreset = 'dsv4-mini',
): Promise<GenerateResult[]> {
  const e = await LLMEngine.create(
    {
      preset,
      modelSeed: 2,
      numBlocks: 128,
      asyncScheduling: true,
      scheduler: {},
      idlePollMs: 2,
      makeDevice: threadedDevice(preset, 2),
    },
    env,
  );
  try {
    const out: GenerateResult[] = [];
    for (const r of requests) out.push(await e.generate(r));
    return out;
  } finally {
    await e.close();
  }
}

/** Each request's logit hashes, joined: what "P/D equals colocated" compares. */
export async function colocatedHashes(
  env: Env,
  requests: readonly GenerateRequest[],
  preset: ModelPreset = 'dsv4-mini',
): Promise<string[]> {
  return (await colocatedRuns(env, requests, preset)).map((r) => r.logitsHashes.join(','));
}
