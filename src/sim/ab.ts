/**
 * `handoff ab`: the end-to-end A/B of the seed's race, in one process with real threads.
 *
 * A colocated engine computes the reference for every prompt. Then, per variant, a fresh 1P1D pair
 * (inproc NIC thread, threaded devices, async scheduling) serves the same prompts with concurrent,
 * staggered arrivals, so new requests' READs are posted while the decode stream still runs the previous
 * forward: the window in which a zeroing queued behind that forward can land after the READ.
 * Per variant: requests equal to the reference (tokens and logits), mismatches, races reported by the
 * race checker on the decode device, decode tokens/s and ITL p50. With tensor parallel pairs
 * (prefillTp = decodeTp = N) the reference stays colocated at TP=1, so "exact" also says that N ranks, their
 * per-rank slabs and transfers change no bit. With `trace`, also the decode
 * instance's timeline (real_trace.ts): compute ops timed in the compute thread, NIC work requests,
 * requests, and the racing pairs highlighted.
 */
import { assert, rethrowIfAssertion } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import { isHandoffError } from '../util/errors.ts';
import type { RaceChecker } from '../device/race/race_checker.ts';
import { deviceTimeline } from '../device/threaded.ts';
import { TransferEngineCore } from '../transfer/core/transfer_engine.ts';
import { BLOCK_SIZE, type ModelPreset } from '../kv/presets.ts';
import type { ZeroExclusion } from '../connector/zero_exclusion.ts';
import { threadedDevice } from '../engine/devices.ts';
import { buildInstance } from '../engine/build_instance.ts';
import type { GenerateRequest, GenerateResult } from '../engine/llm_engine.ts';
import { PdPair } from './pd_pair.ts';
import { realTrace, type RealRequest } from './real_trace.ts';
import type { SimTrace } from './trace.ts';

export interface AbVariant {
  name: string;
  zeroExclusion: ZeroExclusion;
  syncBeforeRead: boolean;
}

export const AB_VARIANTS: AbVariant[] = [
  { name: 'none', zeroExclusion: 'none', syncBeforeRead: false },
  { name: 'mamba-only', zeroExclusion: 'mamba-only', syncBeforeRead: false },
  { name: 'all-read-groups', zeroExclusion: 'all-read-groups', syncBeforeRead: false },
  { name: 'all-read-groups+syncBeforeRead', zeroExclusion: 'all-read-groups', syncBeforeRead: true },
];

export interface AbVariantResult {
  name: string;
  exactMatch: number;
  mismatchedRequests: number;
  races: number;
  tokensPerSec: number;
  itlMsP50: number;
  /** Extra detail (not part of the JSON contract's required keys). */
  errors: number;
  /** Requests whose READ failed and that decode recomputed instead (the gate wants none). */
  loadFailures: number;
  /** Decode pages whose clipped tail was zeroed after their READ landed (decode pages larger than prefill's). */
  tailsZeroed: number;
  nanRequests: number;
  pagesZeroed: number;
  pagesExcludedFromZeroing: number;
  hostSyncWaits: number;
  sampleRace: string | null;
  /** The decode instance's timeline, when AbOptions.trace is set. */
  trace: SimTrace | null;
}

export interface AbReport {
  model: ModelPreset;
  requests: number;
  /** Tokens per KV page of prefill and decode (they may differ: issue 14). */
  prefillBlockSize: number;
  decodeBlockSize: number;
  variants: AbVariantResult[];
  /** Tensor parallel ranks of each pair's decode (the reference is colocated at TP=1). */
  tensorParallelSize: number;
  /** Tensor parallel ranks of each pair's prefill (may differ from decode's: kv/tp_map.ts). */
  prefillTensorParallelSize: number;
}

export interface AbOptions {
  preset: ModelPreset;
  requests: number;
  maxTokens: number;
  seed: number;
  /** Mean gap between arrivals; arrivals overlap with decoding. */
  arrivalGapMs: number;
  variants?: AbVariant[];
  /** Log the decode instance's ops and work requests and return its timeline per variant. */
  trace?: boolean;
  /** Extra compute-stream time after each decode forward (emulates a bigger model's forward). */
  forwardPadMs?: number;
  /** Tokens per KV page of each instance (default 16); the colocated reference pages by 16. */
  prefillBlockSize?: number;
  decodeBlockSize?: number;
  /** Tensor parallel ranks of each pair's prefill and decode (may differ); the colocated reference stays at TP=1. */
  prefillTp?: number;
  decodeTp?: number;
  /** Decode loads asynchronously (async_read): the request waits in WAITING_FOR_REMOTE_KVS. */
  asyncRead?: boolean;
  onProgress?: (variant: string, done: number, total: number) => void;
}

/** Prompts of varied lengths (some not block aligned, some spanning many pages). */
export function abPrompts(n: number, seed: number, env: Env): GenerateRequest[] {
  const rng = env.rng;
  void seed;
  return Array.from({ length: n }, (_, i) => {
    const len = 8 + rng.int(120);
    return {
      promptTokenIds: Array.from({ length: len }, () => 1 + rng.int(50000)),
      sampling: { maxTokens: 0, temperature: i % 3 === 2 ? 0.7 : 0, seed: 1000 + i, ignoreEos: true },
    };
  });
}

function p50(xs: number[]): number {
  if (xs.length === 0) return 0;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor((s.length - 1) / 2)] as number;
}

const sameRun = (a: GenerateResult, b: GenerateResult): boolean =>
  a.tokenIds.length === b.tokenIds.length &&
  a.tokenIds.every((t, i) => t === b.tokenIds[i]) &&
  a.logitsHashes.every((h, i) => h === b.logitsHashes[i]);

export async function runAb(opts: AbOptions, env: Env): Promise<AbReport> {
  const prompts = abPrompts(opts.requests, opts.seed, env).map((p) => ({
    ...p,
    sampling: { ...p.sampling, maxTokens: opts.maxTokens },
  }));
  const common = instanceCommon(opts);
  const reference = await referenceRuns(prompts, common, opts, env);
  const variants: AbVariantResult[] = [];
  for (const v of opts.variants ?? AB_VARIANTS)
    variants.push(await runVariant(v, { opts, common, prompts, reference }, env));
  return {
    model: opts.preset,
    requests: opts.requests,
    prefillBlockSize: opts.prefillBlockSize ?? BLOCK_SIZE,
    decodeBlockSize: opts.decodeBlockSize ?? BLOCK_SIZE,
    variants,
    tensorParallelSize: opts.decodeTp ?? 1,
    prefillTensorParallelSize: opts.prefillTp ?? 1,
  };
}

/** Instance settings shared by the reference and every variant's pair (pages enough at the smaller size). */
function instanceCommon(opts: AbOptions) {
  const bs = Math.min(opts.prefillBlockSize ?? BLOCK_SIZE, opts.decodeBlockSize ?? BLOCK_SIZE, BLOCK_SIZE);
  const numBlocks = (64 * BLOCK_SIZE) / bs + opts.requests * Math.ceil((128 + opts.maxTokens) / bs) * 2;
  return {
    preset: opts.preset,
    modelSeed: opts.seed,
    numBlocks,
    scheduler: { maxNumSeqs: 64, maxNumBatchedTokens: 256, maxModelLen: 512 },
  };
}

/** What every variant's run shares: the options, the instance settings, the prompts and their reference. */
interface AbRun {
  opts: AbOptions;
  common: ReturnType<typeof instanceCommon>;
  prompts: GenerateRequest[];
  reference: GenerateResult[];
}

/** Reference: colocated, requests one at a time (batch invariance makes this the ground truth). */
async function referenceRuns(
  prompts: GenerateRequest[],
  common: AbRun['common'],
  opts: AbOptions,
  env: Env,
): Promise<GenerateResult[]> {
  const { engine: colo } = await buildInstance(
    {
      ...common,
      asyncScheduling: true,
      idlePollMs: 2,
      makeDevice: threadedDevice(opts.preset, opts.seed),
      connector: null,
    },
    env,
  );
  const reference: GenerateResult[] = [];
  try {
    for (const p of prompts) reference.push(await colo.generate(p));
  } finally {
    await colo.close();
  }
  return reference;
}

/** One variant: a fresh 1P1D pair serves every prompt with staggered, overlapping arrivals. */
async function runVariant(v: AbVariant, run: AbRun, env: Env): Promise<AbVariantResult> {
  const { opts, common } = run;
  const pair = await PdPair.create(
    {
      ...common,
      decode: {
        zeroExclusion: v.zeroExclusion,
        syncBeforeRead: v.syncBeforeRead,
        mode: 'read',
        asyncRead: opts.asyncRead === true,
      },
      raceCheck: true,
      name: `ab-${v.name}`,
      ...(opts.prefillBlockSize !== undefined ? { prefillBlockSize: opts.prefillBlockSize } : {}),
      ...(opts.decodeBlockSize !== undefined ? { decodeBlockSize: opts.decodeBlockSize } : {}),
      ...(opts.forwardPadMs ? { decodeForwardPadMs: opts.forwardPadMs } : {}),
      ...(opts.prefillTp !== undefined ? { prefillTp: opts.prefillTp } : {}),
      ...(opts.decodeTp !== undefined ? { decodeTp: opts.decodeTp } : {}),
    },
    env,
  );
  try {
    const timeline = opts.trace === true ? deviceTimeline(pair.decode.device) : null;
    const transfer = pair.decodeConnector.transfer;
    const nicLog = opts.trace === true && transfer instanceof TransferEngineCore ? transfer : null;
    assert(
      opts.trace !== true || (timeline !== null && nicLog !== null),
      'a traced A/B needs a threaded decode device and a NIC-thread transfer engine',
    );
    timeline?.startTimeline();
    nicLog?.startWorkLog();
    const served = await serveStaggered(v, pair, timeline, run, env);
    const races = (pair.decode.device.raceChecker as RaceChecker | null)?.races() ?? [];
    const trace =
      timeline === null || nicLog === null
        ? null
        : realTrace({
            title: `handoff ab ${v.name}: decode instance of ${opts.preset}, ${run.prompts.length} requests, real threads (NIC completion times as the host observed them)`,
            process: 'D',
            ops: timeline.timeline(),
            workRequests: nicLog.workLogEntries(),
            requests: served.traced.sort((a, b) => a.index - b.index),
            races,
          });
    return variantResult(v, pair, served, races, trace, run);
  } finally {
    await pair.close();
  }
}

/** What serving the prompts on one pair observed. */
interface Served {
  results: (GenerateResult | null)[];
  itls: number[];
  errors: number;
  traced: RealRequest[];
  elapsedMs: number;
}

/** Arrivals `arrivalGapMs` apart, all concurrent; each outcome compared with the reference. */
async function serveStaggered(
  v: AbVariant,
  pair: PdPair,
  timeline: ReturnType<typeof deviceTimeline> | null,
  run: AbRun,
  env: Env,
): Promise<Served> {
  const { opts, prompts, reference } = run;
  const traced: RealRequest[] = [];
  const itls: number[] = [];
  let done = 0;
  let errors = 0;
  const t0 = env.nowMs();
  const results = await Promise.all(
    prompts.map(async (p, i) => {
      await env.sleep(i * opts.arrivalGapMs);
      const startMs = timeline?.timelineNowMs() ?? 0;
      let outcome = 'ok';
      let last: number | null = null;
      try {
        const r = await pair.generate(p, (t) => {
          if (last !== null) itls.push(t - last);
          last = t;
        });
        if (!sameRun(r, reference[i] as GenerateResult)) outcome = 'mismatch';
        return r;
      } catch (e) {
        rethrowIfAssertion(e);
        errors++;
        outcome = `failed ${isHandoffError(e) ? e.code : 'untyped'}`;
        return null;
      } finally {
        if (timeline !== null) traced.push({ index: i, startMs, endMs: timeline.timelineNowMs(), outcome });
        opts.onProgress?.(v.name, ++done, prompts.length);
      }
    }),
  );
  return { results, itls, errors, traced, elapsedMs: env.nowMs() - t0 };
}

function variantResult(
  v: AbVariant,
  pair: PdPair,
  served: Served,
  races: ReturnType<RaceChecker['races']>,
  trace: SimTrace | null,
  run: AbRun,
): AbVariantResult {
  const { results, itls, errors, elapsedMs } = served;
  const { prompts, reference } = run;
  const matched = results.filter((r, i) => r !== null && sameRun(r, reference[i] as GenerateResult)).length;
  const tokens = results.reduce((s, r) => s + (r?.tokenIds.length ?? 0), 0);
  return {
    name: v.name,
    exactMatch: matched,
    mismatchedRequests: prompts.length - matched,
    races: races.length,
    tokensPerSec: tokens / (elapsedMs / 1000),
    itlMsP50: p50(itls),
    errors,
    loadFailures: pair.decode.scheduler.stats.loadFailures,
    tailsZeroed: pair.decodeConnector.worker.reads.stats.tailsZeroed,
    nanRequests: results.filter((r) => r?.nanLogits).length,
    pagesZeroed: pair.decode.scheduler.stats.pagesZeroListed,
    pagesExcludedFromZeroing: pair.decode.scheduler.stats.pagesExcludedFromZeroing,
    hostSyncWaits: pair.decodeConnector.worker.stats.hostSyncWaits,
    sampleRace: races[0] ? JSON.stringify(races[0]).slice(0, 400) : null,
    trace,
  };
}
