/**
 * The accuracy oracle's ground truth: each request run alone on a colocated engine (no connector, a
 * sim device that runs its ops at once). Batch and chunk invariance make this what P/D must match,
 * token for token and logit hash for logit hash. Results are memoised per (preset, model seed,
 * prompt, sampling), so seeds that share requests pay once.
 */
import { SimEnv } from '../util/env.ts';
import type { ModelPreset } from '../kv/presets.ts';
import { simDevice } from '../engine/devices.ts';
import { buildInstance } from '../engine/build_instance.ts';
import type { SimRequestSpec } from './proxy.ts';

export interface ReferenceResult {
  tokenIds: number[];
  logitsHashes: Array<string | null>;
}

const memo = new Map<string, ReferenceResult>();
const MEMO_MAX = 4096;

function keyOf(preset: ModelPreset, modelSeed: number, r: SimRequestSpec): string {
  return JSON.stringify([preset, modelSeed, r.promptTokenIds, r.sampling]);
}

/**
 * Await `p` while running the engine's virtual clock: when every microtask has settled and `p` is
 * still pending, fire the next timer (an idle poll the engine sleeps on). Bounded.
 */
export async function drive<T>(env: SimEnv, p: Promise<T>, roundsMax = 100_000): Promise<T> {
  let settled = false;
  p.then(
    () => (settled = true),
    () => (settled = true),
  );
  for (let k = 0; k < roundsMax && !settled; k++) {
    await new Promise((resolve) => setImmediate(resolve));
    const next = env.nextTimerMs();
    if (!settled && next !== null) env.advanceTo(Math.max(next, env.nowMs()));
  }
  return p;
}

export async function colocatedReference(
  preset: ModelPreset,
  modelSeed: number,
  reqs: readonly SimRequestSpec[],
): Promise<ReferenceResult[]> {
  const found = new Map<string, ReferenceResult>();
  for (const r of reqs) {
    const hit = memo.get(keyOf(preset, modelSeed, r));
    if (hit !== undefined) found.set(keyOf(preset, modelSeed, r), hit);
  }
  const missing = reqs.filter((r) => !found.has(keyOf(preset, modelSeed, r)));
  if (missing.length > 0) {
    const env = new SimEnv(0);
    const longest = Math.max(...missing.map((r) => r.promptTokenIds.length + r.sampling.maxTokens));
    const { engine } = await buildInstance(
      {
        preset,
        modelSeed,
        numBlocks: 64 + 4 * Math.ceil(longest / 16),
        asyncScheduling: true,
        scheduler: { maxModelLen: Math.max(1024, longest) },
        idlePollMs: 2,
        makeDevice: simDevice(preset, modelSeed, { autoRun: true }),
        connector: null,
      },
      env,
    );
    try {
      for (const r of missing) {
        const out = await drive(env, engine.generate({ promptTokenIds: r.promptTokenIds, sampling: r.sampling }));
        const res = { tokenIds: out.tokenIds, logitsHashes: out.logitsHashes };
        if (memo.size >= MEMO_MAX) memo.clear();
        memo.set(keyOf(preset, modelSeed, r), res);
        found.set(keyOf(preset, modelSeed, r), res);
      }
    } finally {
      await drive(env, engine.close());
    }
  }
  return reqs.map((r) => found.get(keyOf(preset, modelSeed, r)) as ReferenceResult);
}
