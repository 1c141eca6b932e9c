/**
 * Model throughput against a roofline measured in the same run: a plain TS matmul (dot products
 * against pre-transposed f32 weights, the same kernel shape as the model's matVec). Absolute
 * numbers vary from run to run on shared machines; the ratio is what to compare.
 *
 * Workload: one prefill of `tokens` tokens (one chunk, sampled), then `tokens` decode steps, one
 * request, greedy. Time comes from the injected Env (never performance.now directly).
 */
import { assert } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import { presetKVGroups, BLOCK_SIZE, type ModelPreset } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import { createModel } from './model.ts';
import { matVec, type FlopCounter } from './ops.ts';
import type { ForwardRequest } from './types.ts';

export interface ModelBenchResult {
  preset: ModelPreset;
  tokensPerSec: number;
  gflops: number;
  rooflineGflops: number;
  ratio: number;
}

/** Bounds of the roofline loop: at least ROOFLINE_MIN_MS of work, at most ROOFLINE_MAX_REPS products. */
const ROOFLINE_MIN_MS = 200;
const ROOFLINE_MAX_REPS = 4096;
const BENCH_SEED = 1;

/** GFLOP/s of plain TS matrix products (64 inputs, 8192 outputs: the lm head's shape, in L2). */
export function measureRoofline(env: Env): number {
  const rows = 8192;
  const cols = 64;
  const w = new Float32Array(rows * cols);
  for (let i = 0; i < w.length; i++) w[i] = ((i * 2654435761) % 1000) / 1000 - 0.5;
  const x = new Float64Array(cols).map((_, i) => Math.cos(i));
  const out = new Float64Array(rows);
  const fc: FlopCounter = { flops: 0 };
  const lin = { rows, cols, w };
  for (let i = 0; i < 16; i++) matVec(lin, x, 0, out, 0, fc); // warm up the JIT
  fc.flops = 0;
  const t0 = env.nowMs();
  let reps = 0;
  while (reps < ROOFLINE_MAX_REPS && (reps < 16 || env.nowMs() - t0 < ROOFLINE_MIN_MS)) {
    matVec(lin, x, 0, out, 0, fc);
    x[reps % cols] = out[reps % rows] as number; // keep the work observable
    reps++;
  }
  const ms = env.nowMs() - t0;
  return ms > 0 ? fc.flops / ms / 1e6 : 0;
}

export async function benchModel(opts: { preset: ModelPreset; env: Env; tokens: number }): Promise<ModelBenchResult> {
  const { preset, env, tokens } = opts;
  assert(Number.isInteger(tokens) && tokens >= 1 && tokens <= 8192, `bench tokens must be 1..8192, got ${tokens}`);
  const groups = presetKVGroups(preset);
  const pagesPerRequest = Math.ceil((2 * tokens + 1) / BLOCK_SIZE);
  const kvConfig = makeKVCacheConfig(groups, 1 + groups.length * pagesPerRequest);
  const slabs = Array.from(
    { length: kvConfig.numSlabs },
    () => new Uint8Array(kvConfig.numBlocks * kvConfig.pageBytes),
  );
  let next = 1;
  const blockTables = groups.map((g) => {
    const n = g.spec.type === 'mamba' ? 1 : pagesPerRequest;
    return Array.from({ length: n }, () => next++);
  });
  const model = createModel(preset, BENCH_SEED, kvConfig);
  const prompt = Array.from({ length: tokens }, (_, i) => (i * 7919 + 13) % model.config.vocabSize);
  const request = (tokenIds: number[], startPos: number, outputIndex: number): ForwardRequest => ({
    requestId: 'bench',
    tokenIds,
    startPos,
    blockTables,
    sample: true,
    sampling: { temperature: 0, seed: BENCH_SEED, outputIndex },
  });
  // Warm-up on the same pages (the timed prefill starts at position 0 and overwrites them).
  model.forward({ step: 0, requests: [request(prompt.slice(0, Math.min(tokens, 16)), 0, 0)] }, slabs);
  const flops0 = model.counter.flops;
  const t0 = env.nowMs();
  let out = model.forward({ step: 1, requests: [request(prompt, 0, 0)] }, slabs).outputs[0];
  for (let i = 0; i < tokens; i++) {
    const last = out?.tokenId ?? 0;
    out = model.forward({ step: 2 + i, requests: [request([last], tokens + i, i + 1)] }, slabs).outputs[0];
  }
  const ms = env.nowMs() - t0;
  const flops = model.counter.flops - flops0;
  const rooflineGflops = measureRoofline(env);
  const gflops = ms > 0 ? flops / ms / 1e6 : 0;
  return {
    preset,
    tokensPerSec: ms > 0 ? (2 * tokens * 1000) / ms : 0,
    gflops,
    rooflineGflops,
    ratio: rooflineGflops > 0 ? gflops / rooflineGflops : 0,
  };
}
