/**
 * Scenarios: a 1P1D deployment, its requests and its limits, built from (name, preset, seed) alone,
 * so a replay command names everything needed to rebuild the world.
 *
 *   1p1d             N requests, READ; one prompt ends on a page boundary (decode's lookahead then
 *                    allocates a recompute tail page prefill never had)
 *   1p1d-write       the same with WRITE (prefill pushes; decode waits in WAITING_FOR_REMOTE_KVS)
 *   preempt          a tiny decode page budget: requests are preempted and recomputed
 *   abort            one request is aborted while its READ is in flight (an explorer choice)
 *   peer-death       the prefill instance dies while a READ is in flight (an explorer choice)
 *   prefix-hit       requests share a 2-page prefix: local prefix hits on both sides, READ of the rest
 *   chunked-prefill  long prompts in 32-token chunks
 *   abort-write      `abort` with WRITE: decode aborts a request while prefill's WRITE into it is in flight
 *   cancel-everywhere        READ; each request's client goes away at a point drawn from the seed (or
 *                            never): before prefill, during prefill, between prefill's answer and decode's
 *                            request, during its READ, during decode; the explorer picks the moment
 *   cancel-everywhere-write  the same in WRITE mode (the transfer point is then its WRITE)
 *   tight-write      WRITE, 8 requests, a 16-page decode pool: landed loads hold most pages while the
 *                    head waits for more (vLLM #57841; deadlocked before page holders went first)
 *   hetero-block     prefill and decode with different block sizes (issue 14): unless the options say
 *                    otherwise, the pairing is drawn from the seed among the six unequal pairings of
 *                    {8, 16, 32}, and so is the mode (READ or WRITE; READ for Mamba models); 4 requests:
 *                    one a multiple of 32 tokens (decode's lookahead tail), the others a shared 32-token
 *                    prefix (prefix hits on both sides) plus 3-40 tokens, so transfers end mid-page on
 *                    either side; the second has 2-8 (mod 32) tokens in all, so whenever decode's pages
 *                    are the larger, its last decode page is filled only in part (a clipped tail), on
 *                    Mamba models (prefill computes N-1) too; a world of one request (DPOR's) gets the
 *                    second's kind, so it has the clipped tail
 *
 *   hetero-tp        prefill and decode of different tensor parallel degrees (issue 14): unless the
 *                    options name them, P TP 2 / D TP 1 or P TP 1 / D TP 2 drawn from the seed, and with
 *                    them a block size pairing among all nine of {8, 16, 32} and the mode (READ or
 *                    WRITE; READ for Mamba models); the requests of hetero-block (shared prefix, clipped
 *                    tails when decode's pages are the larger)
 *
 * Block sizes: `blockSize` sets both sides, `prefillBlockSize` / `decodeBlockSize` one each (they win);
 * the pools keep their capacity in tokens (pagesFor).
 *   stop-token       1p1d's requests, READ or WRITE drawn from the seed (READ for Mamba models), each with
 *                    EOS honoured and a stop token: the one its colocated run samples at an output index
 *                    drawn from the seed (the first request: 0), so requests stop early, some on prefill's
 *                    one token (whose answer must still hand decode its KV)
 *   hetero-hit       hetero-block with prefill's pages the larger (a pairing of {8, 16, 32} drawn from the
 *                    seed) and a shared prefix of 40, 48 or 56 tokens in every request: decode's prefix hit
 *                    ends inside a prefill page, so its READ (or prefill's WRITE) starts mid-page there
 *   xpyd             2 prefills + 2 decodes behind the KV-aware router (serve/kv_router.ts), whose index
 *                    follows every instance's KV events through a channel that loses, duplicates and
 *                    reorders batches; one decode restarts (a new event epoch) once idle; requests
 *                    share two 2-page prefixes, so some go decode-only (sim/xpyd.ts); decode pools small
 *                    enough to evict, so some are routed on pages a decode no longer holds
 *   1p1d-async       1p1d with async READ loads (async_read): each request waits in WAITING_FOR_REMOTE_KVS
 *                    while its READ is in flight, the batch goes on, and its first forward comes in a
 *                    later step; the zeroing of its pages still races the READ (the seed's race)
 *   abort-async      `abort` with async READ loads: the request is aborted while it waits for its READ
 *   hybrid           1p1d's requests on the model's Mamba twin (hybrid-micro, or hybrid-mini for a mini
 *                    model), whatever model is asked: every READ also moves a Mamba state page, so `sim
 *                    --scenario all` on the default (attention-only) model still judges the state handoff
 */
import { HandoffError } from '../util/errors.ts';
import { SeededRng } from '../util/env.ts';
import type { MutantName } from '../util/mutants.ts';
import { BLOCK_SIZE, checkTensorParallelSize, isBlockSize, isMicroPreset, kvTwin } from '../kv/presets.ts';
import type { ModelPreset } from '../kv/presets.ts';
import { pagesForOneRequest } from '../serve/instance.ts';
import { vocabSizeOf } from '../model/config.ts';
import { DEFAULT_ONE_SIDED_CONFIG, type OneSidedConfig } from '../connector/config.ts';
import type { SchedulerConfig } from '../engine/scheduler_config.ts';
import { streamSeed } from './explorer.ts';
import type { SimRequestSpec } from './proxy.ts';
import { colocatedReference, type ReferenceResult } from './reference.ts';

export const SCENARIOS = [
  '1p1d',
  '1p1d-write',
  'preempt',
  'abort',
  'peer-death',
  'prefix-hit',
  'chunked-prefill',
  'abort-write',
  'cancel-everywhere',
  'cancel-everywhere-write',
  'tight-write',
  'hetero-block',
  'xpyd',
  'hetero-tp',
  'stop-token',
  'hetero-hit',
  'hybrid',
  '1p1d-async',
  'abort-async',
] as const;
export type ScenarioName = (typeof SCENARIOS)[number];

export function isScenarioName(s: string): s is ScenarioName {
  return (SCENARIOS as readonly string[]).includes(s);
}

export interface SideConfig {
  numBlocks: number;
  /** Tokens per KV page on this side. */
  blockSize: number;
  /** Tensor parallel ranks of the instance (the sides may differ: kv/tp_map.ts). */
  tensorParallelSize: number;
  scheduler: Partial<SchedulerConfig>;
  connector: OneSidedConfig;
}

export interface ScenarioConfig {
  name: ScenarioName;
  preset: ModelPreset;
  modelSeed: number;
  mode: 'read' | 'write';
  requests: SimRequestSpec[];
  prefill: SideConfig;
  decode: SideConfig;
  /** Scenario actions offered to the explorer while a READ is in flight. */
  abortTarget: number | null;
  killPrefillMidRead: boolean;
  /** Per request: where its client goes away (null: it stays). */
  cancelPoints: Array<CancelPoint | null>;
  /** Prefill's answer reaches the proxy as an explorer choice (a window to cancel in), not at once. */
  answerHop: boolean;
  idlePollMs: number;
  notifyTimeoutMs: number;
  /** xpyd: the extra instances and the router (null: one prefill and one decode, the proxy's flow). */
  xpyd: XpydScenario | null;
}

export interface XpydScenario {
  prefills: number;
  decodes: number;
  kvWeight: number;
  skipPrefillMaxTokens: number;
  /** The decode that restarts once idle (index into the decodes). */
  restartDecode: number;
}

/** Where in a request's life its client may go away (cancel_points.ts offers each as an explorer action). */
export const CANCEL_POINTS = [
  'before-prefill',
  'during-prefill',
  'after-answer',
  'during-transfer',
  'during-decode',
] as const;
export type CancelPoint = (typeof CANCEL_POINTS)[number];

export function isCancelScenario(name: ScenarioName): boolean {
  return name === 'cancel-everywhere' || name === 'cancel-everywhere-write';
}

/** Each request's cancel point, drawn from the seed: every point, or none, equally likely. */
function cancelPoints(name: ScenarioName, rng: SeededRng, n: number): Array<CancelPoint | null> {
  if (!isCancelScenario(name)) return Array.from({ length: n }, () => null);
  return Array.from({ length: n }, () => CANCEL_POINTS[rng.int(CANCEL_POINTS.length + 1)] ?? null);
}

/** The weights' seed of every scenario's model. */
const SIM_MODEL_SEED = 1;

/** Virtual-time limits shared by every scenario (short, so leases and timeouts fire within a run). */
export const SIM_LEASE_MS = 300;
export const SIM_TRANSFER_TIMEOUT_MS = 100;

/** Prompt ids are drawn from [1, min(50000, vocab - 1)): never 0 nor EOS (the last id). */
function prompt(rng: SeededRng, n: number, vocabSize: number): number[] {
  const limit = Math.min(50_000, vocabSize - 1);
  return Array.from({ length: n }, () => 1 + rng.int(limit - 1));
}

/** The scenario's requests, drawn from `rng` (prompt lengths, tokens, arrival times). */
function scenarioRequests(name: ScenarioName, rng: SeededRng, n: number, vocab: number): SimRequestSpec[] {
  const maxTokens = name === 'preempt' ? 10 : 3;
  const hetero = name === 'hetero-block' || name === 'hetero-tp' || name === 'hetero-hit';
  const shared = name === 'prefix-hit' || hetero;
  // hetero-hit: a prefix that ends inside a 32-token page (decode's hit is not aligned to prefill's pages).
  const prefix = shared ? prompt(rng, name === 'hetero-hit' ? 32 + 8 * (1 + rng.int(3)) : 32, vocab) : [];
  const xpydPrefixes = name === 'xpyd' ? [prompt(rng, 32, vocab), prompt(rng, 32, vocab)] : [];
  let arrivalMs = 0;
  return Array.from({ length: n }, (_, index) => {
    let len: number;
    if (name === 'chunked-prefill') len = 60 + rng.int(90);
    else if (name === 'preempt') len = 20 + rng.int(25);
    else if (index === 0 && hetero)
      len = 32 * (1 + rng.int(2)); // aligned to every block size: decode's lookahead adds a tail page
    else if (index === 0)
      len = 16 * (1 + rng.int(4)); // page aligned: decode's lookahead adds a tail page
    else len = 5 + rng.int(70);
    // Draws stay in the order each scenario was measured with (the bug zoo's seed bounds depend on it).
    // A lone request (`--requests 1`, DPOR's worlds) is the second's kind: its clipped tail is the world's only one.
    const tailed = index === 1 || (n === 1 && name !== 'hetero-hit');
    const heteroSuffix = !hetero ? 0 : tailed ? 32 * rng.int(2) + 2 + rng.int(7) : 3 + rng.int(38);
    const tokens =
      name === 'prefix-hit'
        ? [...prefix, ...prompt(rng, 3 + rng.int(28), vocab)]
        : hetero && (index > 0 || name === 'hetero-hit' || tailed)
          ? [...prefix, ...prompt(rng, heteroSuffix, vocab)]
          : name === 'xpyd'
            ? [...(xpydPrefixes[rng.int(2)] as number[]), ...prompt(rng, 3 + rng.int(30), vocab)]
            : prompt(rng, len, vocab);
    arrivalMs += shared || name === 'xpyd' ? 15 + rng.int(10) : rng.int(4);
    return {
      index,
      promptTokenIds: tokens,
      sampling: { maxTokens, temperature: index % 2 === 1 ? 0.8 : 0, seed: 100 + index, ignoreEos: true },
      arrivalMs,
    };
  });
}

/**
 * stop-token: every request honours EOS and stops on the token its colocated run samples at an output
 * index drawn from the seed (so it stops there, or earlier where that token came before); the first
 * request on its first token, prefill's, whose answer must still hand decode its KV.
 */
function drawStops(requests: SimRequestSpec[], rng: SeededRng, preset: ModelPreset, modelSeed: number): void {
  const runs = colocatedReference(preset, modelSeed, requests);
  requests.forEach((r, i) => {
    const tokens = (runs[i] as ReferenceResult).tokenIds;
    const at = tokens[i === 0 ? 0 : rng.int(tokens.length)] as number;
    r.sampling = { ...r.sampling, ignoreEos: false, stopTokenIds: [at] };
  });
}

/** One side's connector config, with the mutant (if any) planted on the side it belongs to. */
function scenarioConnector(
  role: 'producer' | 'consumer',
  mode: 'read' | 'write',
  name: ScenarioName,
  opts: ScenarioOptions,
): OneSidedConfig {
  const mutant = opts.mutant;
  // READ loads: async in the -async scenarios, and in every READ scenario when asked (serving's default).
  const asyncRead = mode === 'read' && (opts.asyncRead === true || name === '1p1d-async' || name === 'abort-async');
  const c: OneSidedConfig = {
    ...DEFAULT_ONE_SIDED_CONFIG,
    role,
    mode,
    leaseMs: SIM_LEASE_MS,
    transferTimeoutMs: SIM_TRANSFER_TIMEOUT_MS,
    asyncRead: asyncRead && role === 'consumer',
  };
  if (mutant === undefined) return c;
  if (role === 'consumer' && mutant === 'zero-none') c.zeroExclusion = 'none';
  if (role === 'consumer' && mutant === 'zero-mamba-only') c.zeroExclusion = 'mamba-only';
  if (role === 'consumer' && mutant === 'zero-after-loads') c.zeroExclusion = 'none';
  // The TP mapper runs where the ranges are built: decode for a READ, prefill for a WRITE.
  const mapper = mode === 'read' ? 'consumer' : 'producer';
  const site: Partial<Record<MutantName, 'producer' | 'consumer'>> = {
    'no-await-reads': 'consumer',
    'tail-not-zeroed': 'consumer',
    'free-before-release': 'producer',
    'lease-no-drain': 'producer',
    'write-done-early': 'producer',
    'stale-writer': 'consumer',
    'read-done-early': 'consumer',
    'prefix-shift': 'consumer',
    'leak-on-cancel': 'consumer',
    'clip-tail-not-zeroed': 'consumer',
    'abort-not-awaited': 'consumer',
    'release-lost': 'consumer',
    'zero-after-loads': 'consumer',
    'head-layout-mismatch': mapper,
    'tp-slice-off-by-one': mapper,
    'split-tail-dropped': mapper,
    'split-first-wr-only': 'consumer',
    'slot-leak-on-fail': 'consumer',
    'stop-no-handoff': 'producer',
    'hit-start-rounded-up': 'consumer',
    'mamba-state-dropped': 'consumer',
    'grant-one-page-short': 'producer',
  };
  if (site[mutant] === role) c.mutant = mutant;
  return c;
}

/** Tokens per page: `blockSize` both sides, `prefillBlockSize` / `decodeBlockSize` one side each (they win). */
export interface BlockSizeOptions {
  blockSize?: number;
  prefillBlockSize?: number;
  decodeBlockSize?: number;
}

/** The options' block sizes that are set (to pass them on). */
export function blockSizeOptions(o: BlockSizeOptions): BlockSizeOptions {
  const out: BlockSizeOptions = {};
  if (o.blockSize !== undefined) out.blockSize = o.blockSize;
  if (o.prefillBlockSize !== undefined) out.prefillBlockSize = o.prefillBlockSize;
  if (o.decodeBlockSize !== undefined) out.decodeBlockSize = o.decodeBlockSize;
  return out;
}

/** The unequal pairings hetero-block draws from: [prefill, decode] tokens per page. */
export const HETERO_PAIRINGS: ReadonlyArray<readonly [number, number]> = [
  [8, 16],
  [8, 32],
  [16, 32],
  [16, 8],
  [32, 8],
  [32, 16],
];

/** The pairings hetero-tp draws from: every [prefill, decode] of {8, 16, 32}, equal ones included. */
export const TP_BLOCK_PAIRINGS: ReadonlyArray<readonly [number, number]> = [8, 16, 32].flatMap((p) =>
  [8, 16, 32].map((d) => [p, d] as const),
);

/** hetero-hit's [prefill, decode] block sizes: prefill's pages the larger. */
export const HETERO_HIT_PAIRINGS: ReadonlyArray<readonly [number, number]> = [
  [16, 8],
  [32, 8],
  [32, 16],
];

/** The [prefill, decode] tensor parallel degrees hetero-tp draws from. */
export const HETERO_TP_PAIRINGS: ReadonlyArray<readonly [number, number]> = [
  [2, 1],
  [1, 2],
];

/** [prefill, decode] tokens per page: the options, else (hetero-block, hetero-tp) a pairing from the seed, else 16. */
function sideBlockSizes(name: ScenarioName, rng: SeededRng, o: BlockSizeOptions): [number, number] {
  const drawn =
    name === 'hetero-block'
      ? HETERO_PAIRINGS[rng.int(HETERO_PAIRINGS.length)]
      : name === 'hetero-hit'
        ? HETERO_HIT_PAIRINGS[rng.int(HETERO_HIT_PAIRINGS.length)]
        : name === 'hetero-tp'
          ? TP_BLOCK_PAIRINGS[rng.int(TP_BLOCK_PAIRINGS.length)]
          : undefined;
  const both = o.blockSize;
  return [
    o.prefillBlockSize ?? both ?? drawn?.[0] ?? BLOCK_SIZE,
    o.decodeBlockSize ?? both ?? drawn?.[1] ?? BLOCK_SIZE,
  ];
}

/** READ or WRITE: by name; hetero-block, hetero-tp and stop-token draw it (READ on Mamba models: WRITE needs none). */
function scenarioMode(name: ScenarioName, preset: ModelPreset, rng: SeededRng): 'read' | 'write' {
  if (name === 'hetero-block' || name === 'hetero-tp' || name === 'hetero-hit' || name === 'stop-token') {
    const write = rng.int(2) === 1;
    return write && kvTwin(preset) !== 'hybrid-mini' ? 'write' : 'read';
  }
  return ['1p1d-write', 'abort-write', 'cancel-everywhere-write', 'tight-write'].includes(name) ? 'write' : 'read';
}

/** A pool of `pages16` pages of 16 tokens, as pages of `blockSize` tokens holding as many tokens (+ the null page). */
function pagesFor(pages16: number, blockSize: number): number {
  return 1 + Math.ceil(((pages16 - 1) * BLOCK_SIZE) / blockSize);
}

/**
 * xpyd's decode pools: room for the longest request and no more (lookahead included), so decodes evict
 * prefixes the index may still count and some decode-only requests reach a decode that lost its prefix.
 * With 64 pages nothing was ever evicted: no BlockRemoved, no stale claim, and an index that ignored
 * BlockRemoved passed (sim/xpyd_eviction.test.ts).
 */
function xpydDecodePages(preset: ModelPreset, requests: SimRequestSpec[], blockSize: number): number {
  const longest = Math.max(...requests.map((r) => r.promptTokenIds.length + r.sampling.maxTokens));
  return pagesForOneRequest(preset, longest + DECODE_LOOKAHEAD, blockSize);
}

/** Lookahead slots decode reserves (like MTP) in every scenario but `preempt`. */
const DECODE_LOOKAHEAD = 4;

/** Requests per world where a scenario wants other than 3. */
const DEFAULT_REQUESTS: Partial<Record<ScenarioName, number>> = {
  preempt: 4,
  'prefix-hit': 4,
  'hetero-block': 4,
  'hetero-tp': 4,
  'hetero-hit': 4,
  'tight-write': 8,
  xpyd: 8,
};

/** Tensor parallel degrees [prefill, decode] (each dividing the shards) and block sizes, or BAD_CONFIG. */
function checkGeometryOptions(
  preset: ModelPreset,
  opts: { prefillTp?: number; decodeTp?: number } & BlockSizeOptions,
): [number, number] {
  const prefillTp = checkTensorParallelSize(preset, opts.prefillTp ?? 1, 'prefill-tp');
  const decodeTp = checkTensorParallelSize(preset, opts.decodeTp ?? 1, 'decode-tp');
  for (const bs of [opts.blockSize, opts.prefillBlockSize, opts.decodeBlockSize])
    if (bs !== undefined && !isBlockSize(bs))
      throw new HandoffError('BAD_CONFIG', `block size must be a power of two in [1, 256], got ${bs}`);
  return [prefillTp, decodeTp];
}

/** The model a scenario runs: `hybrid` the asked model's Mamba twin (the same size of model), the others it. */
export function scenarioPreset(name: ScenarioName, preset: ModelPreset): ModelPreset {
  if (name !== 'hybrid') return preset;
  return isMicroPreset(preset) ? 'hybrid-micro' : 'hybrid-mini';
}

/** What a run sets of a scenario; the rest comes from its name and seed. */
export interface ScenarioOptions extends BlockSizeOptions {
  requests?: number;
  mutant?: MutantName;
  prefillTp?: number;
  decodeTp?: number;
  /** Decode loads READs asynchronously in every READ scenario (`sim --async-read`). */
  asyncRead?: boolean;
}

export function buildScenario(
  name: ScenarioName,
  askedPreset: ModelPreset,
  seed: number,
  opts: ScenarioOptions = {},
): ScenarioConfig {
  const preset = scenarioPreset(name, askedPreset);
  const checkedTp = checkGeometryOptions(preset, opts);
  const rng = new SeededRng(streamSeed(seed, 3));
  const [prefillBs, decodeBs] = sideBlockSizes(name, rng, opts);
  const mode = scenarioMode(name, preset, rng);
  // hetero-tp draws its degrees unless the options name them (only its own draws: the others keep theirs).
  const drawTp = name === 'hetero-tp' && opts.prefillTp === undefined && opts.decodeTp === undefined;
  const [prefillTp, decodeTp] = drawTp
    ? (HETERO_TP_PAIRINGS[rng.int(HETERO_TP_PAIRINGS.length)] as readonly [number, number])
    : checkedTp;
  if (mode === 'write' && kvTwin(preset) === 'hybrid-mini')
    throw new HandoffError('BAD_CONFIG', `WRITE mode needs a model without Mamba layers (${preset} is READ only)`);
  const n = opts.requests ?? DEFAULT_REQUESTS[name] ?? 3;
  const requests = scenarioRequests(name, rng, n, vocabSizeOf(preset));
  const mutant = opts.mutant;
  const connector = (role: 'producer' | 'consumer'): OneSidedConfig => scenarioConnector(role, mode, name, opts);
  const chunk = name === 'chunked-prefill' ? 32 : 256;
  // Cancel scenarios: decode's policy for a cut transfer, from the seed (fail: an error; recompute: exact output).
  const failurePolicy = isCancelScenario(name) ? (rng.int(2) === 0 ? 'fail' : 'recompute') : null;
  if (name === 'stop-token') drawStops(requests, rng, preset, SIM_MODEL_SEED);
  const sched = (role: 'producer' | 'consumer'): Partial<SchedulerConfig> => ({
    maxNumSeqs: 8,
    maxNumBatchedTokens: chunk,
    // Decode reserves lookahead slots (like MTP): a prompt ending on a page boundary gets a tail page.
    numLookaheadTokens: role === 'consumer' && name !== 'preempt' ? DECODE_LOOKAHEAD : 0,
    ...(mutant === 'free-on-abort' ? { mutant } : {}),
    ...(role === 'consumer' && failurePolicy !== null ? { kvLoadFailurePolicy: failurePolicy } : {}),
  });
  return {
    name,
    preset,
    modelSeed: SIM_MODEL_SEED,
    mode,
    requests,
    prefill: {
      numBlocks: pagesFor(64, prefillBs),
      blockSize: prefillBs,
      tensorParallelSize: prefillTp,
      scheduler: sched('producer'),
      connector: connector('producer'),
    },
    decode: {
      numBlocks:
        name === 'xpyd'
          ? xpydDecodePages(preset, requests, decodeBs)
          : pagesFor(name === 'preempt' ? 13 : name === 'tight-write' ? 16 : 64, decodeBs),
      blockSize: decodeBs,
      tensorParallelSize: decodeTp,
      scheduler: sched('consumer'),
      connector: connector('consumer'),
    },
    abortTarget: name === 'abort' || name === 'abort-write' || name === 'abort-async' ? rng.int(n) : null,
    killPrefillMidRead: name === 'peer-death',
    cancelPoints: cancelPoints(name, rng, n),
    answerHop: isCancelScenario(name),
    idlePollMs: 2,
    notifyTimeoutMs: 50,
    // Drawn last: the other scenarios' draws stay as they were.
    xpyd:
      name === 'xpyd'
        ? { prefills: 2, decodes: 2, kvWeight: 4, skipPrefillMaxTokens: 24, restartDecode: rng.int(2) }
        : null,
  };
}
