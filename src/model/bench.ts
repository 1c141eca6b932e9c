/**
 * Model throughput against a roofline measured in the same run: a plain TS matmul (dot products
 * against pre-transposed f32 weights, the same kernel shape as the model's matVec). Absolute
 * numbers vary from run to run on shared machines; the ratio is what to compare.
 *
 * Workload: one prefill of `tokens` tokens (one chunk, sampled), then `tokens` decode steps, one
 * request, greedy. Time comes from the injected Env (never performance.now directly).
 *
 * benchTensorParallel: that workload on the threaded device at TP=1 and TP=N in the same run (ratio).
 */
import { assert } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import { presetKVGroups, BLOCK_SIZE, type ModelPreset } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import { createThreadedDevice } from '../device/threaded.ts';
import type { Device } from '../device/types.ts';
import { vocabSizeOf } from './config.ts';
import { createModel } from './model.ts';
import { matVec, type FlopCounter } from './ops.ts';
import { rooflineOperands } from './roofline.ts';
import type { ForwardArgs, ForwardRequest, ForwardResult } from './types.ts';

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
  const { lin, x, out } = rooflineOperands();
  const { rows, cols } = lin;
  const fc: FlopCounter = { flops: 0 };
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

export interface TensorParallelBenchResult {
  preset: ModelPreset;
  tensorParallelSize: number;
  /** Median over `reps` alternating runs, on the threaded device (one compute thread per rank). */
  tp1TokensPerSec: number;
  tpTokensPerSec: number;
  /** tpTokensPerSec / tp1TokensPerSec. */
  speedup: number;
  /**
   * What the machine gives N threads in this run: N compute threads each running independent roofline
   * products (no collective, no sharing) vs one, in aggregate throughput. The ceiling of `speedup`.
   */
  threadScaling: number;
  reps: number;
}

const KERNELS_URL = new URL('./kernels.ts', import.meta.url).href;

/**
 * The same workload as benchModel on threaded devices with 1 and `tensorParallelSize` ranks (every
 * forward a kernel op awaited by the host), alternating `reps` times so both see the same machine.
 */
export async function benchTensorParallel(opts: {
  preset: ModelPreset;
  env: Env;
  tokens: number;
  tensorParallelSize: number;
  reps?: number;
}): Promise<TensorParallelBenchResult> {
  const { preset, env, tokens, tensorParallelSize: tp } = opts;
  const reps = opts.reps ?? 3;
  assert(Number.isInteger(tokens) && tokens >= 1 && tokens <= 8192, `bench tokens must be 1..8192, got ${tokens}`);
  const devices = [await benchDevice(preset, tokens, 1), await benchDevice(preset, tokens, tp)];
  try {
    const rates: number[][] = [[], [], []];
    for (let r = 0; r < reps; r++) {
      for (const [i, d] of devices.entries()) rates[i]?.push(await runOnDevice(d, tokens, env));
      rates[2]?.push(await threadScaling(devices[0] as BenchDevice, devices[1] as BenchDevice, tp, env));
    }
    const [one, many, scaling] = rates.map(median) as [number, number, number];
    return {
      preset,
      tensorParallelSize: tp,
      tp1TokensPerSec: one,
      tpTokensPerSec: many,
      speedup: many / one,
      threadScaling: scaling,
      reps,
    };
  } finally {
    await Promise.all(devices.map((d) => d.device.close()));
  }
}

/** Aggregate roofline throughput of `tp` rank threads (each its own products) over one thread's. */
async function threadScaling(one: BenchDevice, many: BenchDevice, tp: number, env: Env): Promise<number> {
  const timed = async (d: BenchDevice, reps: number): Promise<number> => {
    const t0 = env.nowMs();
    await d.device.compute.enqueue({
      op: { kind: 'kernel', name: 'matmul', args: { reps } },
      label: { what: 'matmul' },
    }).done;
    return env.nowMs() - t0;
  };
  for (const d of [one, many]) await timed(d, 32); // warm up the JIT of every thread
  const oneMs = await timed(one, 400);
  const manyMs = await timed(many, 400);
  return manyMs > 0 ? (tp * oneMs) / manyMs : 0;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? 0;
}

interface BenchDevice {
  device: Device;
  blockTables: number[][];
  vocabSize: number;
}

async function benchDevice(preset: ModelPreset, tokens: number, tp: number): Promise<BenchDevice> {
  const groups = presetKVGroups(preset);
  const pagesPerRequest = Math.ceil((2 * tokens + 1) / BLOCK_SIZE);
  const kvConfig = makeKVCacheConfig(groups, 1 + groups.length * pagesPerRequest, tp);
  let next = 1;
  const blockTables = groups.map((g) =>
    Array.from({ length: g.spec.type === 'mamba' ? 1 : pagesPerRequest }, () => next++),
  );
  const device = await createThreadedDevice({
    numSlabs: kvConfig.numSlabs,
    numBlocks: kvConfig.numBlocks,
    pageBytes: kvConfig.pageBytes,
    kernelModuleUrl: KERNELS_URL,
    kernelInit: { preset, seed: BENCH_SEED, kvConfig },
    tensorParallelSize: tp,
  });
  return { device, blockTables, vocabSize: vocabSizeOf(preset) };
}

/** Tokens per second of one prefill of `tokens` and `tokens` decode steps, each a forward op on the device. */
async function runOnDevice(d: BenchDevice, tokens: number, env: Env): Promise<number> {
  const prompt = Array.from({ length: tokens }, (_, i) => (i * 7919 + 13) % d.vocabSize);
  const forward = async (tokenIds: number[], startPos: number, outputIndex: number): Promise<number> => {
    const args: ForwardArgs = {
      step: outputIndex,
      requests: [
        {
          requestId: 'bench',
          tokenIds,
          startPos,
          blockTables: d.blockTables,
          sample: true,
          sampling: { temperature: 0, seed: BENCH_SEED, outputIndex },
        },
      ],
    };
    const out = (await d.device.compute.enqueue({
      op: { kind: 'kernel', name: 'forward', args },
      label: { what: 'bench' },
    }).done) as ForwardResult;
    return out.outputs[0]?.tokenId ?? 0;
  };
  await forward(prompt.slice(0, Math.min(tokens, 16)), 0, 0); // warm-up
  const t0 = env.nowMs();
  let last = await forward(prompt, 0, 0);
  for (let i = 0; i < tokens; i++) last = await forward([last], tokens + i, i + 1);
  const ms = env.nowMs() - t0;
  return ms > 0 ? (2 * tokens * 1000) / ms : 0;
}
