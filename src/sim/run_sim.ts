/**
 * `handoff sim`: run a scenario over many seeds, judge every run with the oracles, and report in the
 * contract of DESIGN.md §10: {scenario, strategy, seeds, mutant, violations, firstFailingSeed, replay,
 * schedulesPerSec}. Every failure comes with one command that replays it exactly.
 */
import { RealEnv, type Env } from '../util/env.ts';
import type { MutantName } from '../util/mutants.ts';
import { BLOCK_SIZE, type ModelPreset } from '../kv/presets.ts';
import type { Strategy } from './explorer.ts';
import { coverageReport, formatCoverage, mergeCounts, type CoverageReport, type OrderCounts } from './coverage.ts';
import { runDpor } from './dpor_run.ts';
import { judgeEnd } from './oracles.ts';
import { SimThreads } from './sim_threads.ts';
import { blockSizeOptions, buildScenario, type ScenarioName } from './scenarios.ts';
import type { SimTrace } from './trace.ts';
import { DEFAULT_MAX_STEPS, SimWorld, type Violation } from './world.ts';
import type { CrashProbe } from './crash_watch.ts';

export interface SimOptions {
  scenario: ScenarioName;
  strategy: Strategy;
  /** How many seeds to run, from `seed` on. */
  seeds: number;
  /** First seed (default 1; dfs schedules are numbered from 0). */
  seed?: number;
  mutant?: MutantName;
  /** Model preset (default DEFAULT_SIM_PRESET). */
  model?: ModelPreset;
  /** Run only `seed`, with a trace (the replay of a failure). */
  replay?: boolean;
  /** Stop at the first failing seed (the bug zoo's seeds-to-catch). */
  stopAtFirstFailure?: boolean;
  faults?: boolean;
  maxSteps?: number;
  requests?: number;
  /** Tokens per KV page on both instances (default 16; hetero-block: drawn from the seed). */
  blockSize?: number;
  /** Tokens per KV page of one instance (wins over blockSize). */
  prefillBlockSize?: number;
  decodeBlockSize?: number;
  /** Tensor parallel ranks of prefill and decode (default 1; they may differ; hetero-tp: drawn from the seed). */
  prefillTp?: number;
  decodeTp?: number;
  /** Decode loads READs asynchronously in every READ scenario, as serving does by default (`--async-read`). */
  asyncRead?: boolean;
  pctDepth?: number;
  dfsDepth?: number;
  /** dpor (dpor_run.ts): branching choices explored, schedules at most; a replay's schedule. */
  dporDepth?: number;
  maxSchedules?: number;
  schedule?: readonly number[];
  onProgress?: (done: number, total: number, failingSeeds: number) => void;
  /** Seed threads (default 1: this thread). The report is the same for every value. */
  jobs?: number;
  /** Stop starting seeds once this many seconds have passed (`seeds` is then a maximum). */
  budgetS?: number;
  /** Test-only (crash_watch.ts): one seed's timer callback or floating promise asserts. */
  crashProbe?: CrashProbe;
}

export interface SimViolation extends Violation {
  seed: number;
}

/** The keys of DESIGN.md §10, then the run's size: schedules run, distinct ones, threads, wall time. */
export interface SimReport {
  scenario: ScenarioName;
  strategy: Strategy;
  seeds: number;
  mutant: MutantName | null;
  violations: SimViolation[];
  firstFailingSeed: number | null;
  replay: string | null;
  schedulesPerSec: number;
  /** Schedules run (dfs: without the duplicates of smaller seeds). */
  schedules: number;
  /** Distinct schedules among them (distinct sequences of choices). */
  distinctSchedules: number;
  jobs: number;
  wallSeconds: number;
  /** Orders of zero / land / forward seen on transfer destinations (coverage.ts). */
  coverage: CoverageReport;
}

export interface SeedResult {
  seed: number;
  violations: Violation[];
  steps: number;
  virtualMs: number;
  /** Hash of the chosen keys in order: equal hashes, equal schedules. */
  choiceHash: string;
  /** dfs: the schedule equals a smaller seed's. */
  duplicate: boolean;
  faultsFired: Record<string, number>;
  trace: SimTrace | null;
  coverage: OrderCounts;
}

/** The simulator's default model: dsv4-mini's KV pages (fp8 MLA + f32 compressor) on a micro model. */
export const DEFAULT_SIM_PRESET: ModelPreset = 'dsv4-micro';

/** Violations kept per failing seed and in all. */
const PER_SEED_MAX = 3;
const TOTAL_MAX = 50;
const DFS_DUPLICATES_MAX = 64;

export function replayCommand(
  o: Pick<
    SimOptions,
    | 'scenario'
    | 'strategy'
    | 'mutant'
    | 'model'
    | 'faults'
    | 'maxSteps'
    | 'requests'
    | 'pctDepth'
    | 'dfsDepth'
    | 'blockSize'
    | 'prefillBlockSize'
    | 'decodeBlockSize'
    | 'prefillTp'
    | 'decodeTp'
    | 'asyncRead'
  > & { schedule?: readonly number[] },
  seed: number,
): string {
  const parts = ['handoff sim', `--scenario ${o.scenario}`, `--strategy ${o.strategy}`, `--seed ${seed}`];
  if (o.mutant) parts.push(`--mutant ${o.mutant}`);
  if (o.model && o.model !== DEFAULT_SIM_PRESET) parts.push(`--model ${o.model}`);
  if (o.faults === false) parts.push('--no-faults');
  if (o.maxSteps !== undefined && o.maxSteps !== DEFAULT_MAX_STEPS) parts.push(`--max-steps ${o.maxSteps}`);
  if (o.requests !== undefined) parts.push(`--requests ${o.requests}`);
  // hetero-block, hetero-tp and hetero-hit draw their sizes from the seed unless told: there even the default
  // must be named.
  const drawsSizes = o.scenario === 'hetero-block' || o.scenario === 'hetero-tp' || o.scenario === 'hetero-hit';
  if (o.blockSize !== undefined && (o.blockSize !== BLOCK_SIZE || drawsSizes))
    parts.push(`--block-size ${o.blockSize}`);
  if (o.prefillBlockSize !== undefined) parts.push(`--prefill-block-size ${o.prefillBlockSize}`);
  if (o.decodeBlockSize !== undefined) parts.push(`--decode-block-size ${o.decodeBlockSize}`);
  const tpSet = o.prefillTp !== undefined || o.decodeTp !== undefined;
  if ((o.prefillTp ?? 1) !== 1 || (o.decodeTp ?? 1) !== 1 || (tpSet && o.scenario === 'hetero-tp'))
    parts.push(`--prefill-tp ${o.prefillTp ?? 1} --decode-tp ${o.decodeTp ?? 1}`);
  if (o.asyncRead === true) parts.push('--async-read');
  if (o.pctDepth !== undefined) parts.push(`--pct-depth ${o.pctDepth}`);
  if (o.dfsDepth !== undefined) parts.push(`--dfs-depth ${o.dfsDepth}`);
  if (o.schedule !== undefined) parts.push(`--schedule ${o.schedule.join('.') || '0'}`);
  parts.push('--replay');
  return parts.join(' ');
}

/** One seed, start to judgement. */
export async function runSeed(o: SeedOptions, seed: number, trace: boolean): Promise<SeedResult> {
  // A traced run goes on after the first violation, so the timeline shows the racing pair execute.
  const world = await SimWorld.create({
    scenario: o.scenario,
    preset: o.model ?? DEFAULT_SIM_PRESET,
    seed,
    strategy: o.strategy,
    ...(o.mutant ? { mutant: o.mutant } : {}),
    ...(o.faults !== undefined ? { faults: o.faults } : {}),
    ...(o.maxSteps !== undefined ? { maxSteps: o.maxSteps } : {}),
    ...(o.requests !== undefined ? { requests: o.requests } : {}),
    ...blockSizeOptions(o),
    ...tensorParallelOf(o),
    ...(o.asyncRead === true ? { asyncRead: true } : {}),
    explorer: { pctDepth: o.pctDepth, dfsDepth: o.dfsDepth, ...(o.schedule ? { schedule: o.schedule } : {}) },
    trace,
    stopOnViolation: !trace,
    ...(o.crashProbe ? { crashProbe: o.crashProbe } : {}),
  });
  await world.run();
  await judgeEnd(world);
  await world.shutdown();
  const title = `${o.scenario} ${o.strategy} seed ${seed}${o.mutant ? ` mutant ${o.mutant}` : ''} (${o.model ?? DEFAULT_SIM_PRESET})`;
  return {
    seed,
    violations: world.violations,
    steps: world.step,
    virtualMs: world.env.nowMs(),
    choiceHash: world.choiceHash,
    duplicate: world.explorer.duplicate,
    faultsFired: { ...world.buggify.fired },
    trace: world.toTrace(title),
    coverage: world.coverage.finish(),
  };
}

/** What a seed needs besides its number: plain data (it crosses to the seed threads). */
export type SeedOptions = Omit<SimOptions, 'seeds' | 'onProgress' | 'jobs' | 'budgetS'>;

/**
 * Results in seed order from `first` on, while `more()` holds: in this thread (jobs 1) or on `jobs`
 * seed threads with a window of 2 x jobs seeds in flight. Breaking out of the loop closes the threads.
 */
async function* seedResults(
  o: SeedOptions,
  first: number,
  count: number,
  jobs: number,
  more: () => boolean,
  shared: SimThreads | null,
): AsyncGenerator<SeedResult> {
  if (jobs <= 1) {
    for (let k = 0; k < count && (k === 0 || more()); k++) yield await runSeed(o, first + k, o.replay === true);
    return;
  }
  const threads = shared ?? new SimThreads(jobs);
  const inFlight: Array<Promise<SeedResult>> = [];
  let next = 0;
  const fill = (): void => {
    while (next < count && inFlight.length < 2 * jobs && (next === 0 || more()))
      inFlight.push(threads.run(first + next++, o));
  };
  try {
    fill();
    while (inFlight.length > 0) {
      const r = await (inFlight.shift() as Promise<SeedResult>);
      fill();
      yield r;
    }
  } finally {
    // Seeds still in flight are abandoned (their results would come after the one that stopped the run);
    // closing the threads rejects them.
    // catch-ok: an abandoned seed's rejection is the thread being closed, nothing to report
    for (const p of inFlight) p.catch(() => undefined);
    if (shared === null) await threads.close();
  }
}

/** Folds seed results, in seed order, into the report's counts. */
class Tally {
  readonly violations: SimViolation[] = [];
  readonly hashes = new Set<string>();
  readonly coverage: OrderCounts = {};
  firstFailingSeed: number | null = null;
  ran = 0;
  failing = 0;
  done = 0;
  private duplicatesInARow = 0;

  constructor(private readonly o: SimOptions) {}

  /** false: stop here (dfs space exhausted, or the first failure when asked to stop at it). */
  add(r: SeedResult): boolean {
    this.done++;
    if (r.duplicate && !this.o.replay) {
      // dfs: a schedule already run. Many in a row: the bounded space is exhausted.
      return ++this.duplicatesInARow < DFS_DUPLICATES_MAX;
    }
    this.duplicatesInARow = 0;
    this.ran++;
    this.hashes.add(r.choiceHash);
    mergeCounts(this.coverage, r.coverage);
    if (r.violations.length > 0) {
      this.failing++;
      this.firstFailingSeed ??= r.seed;
      for (const v of r.violations.slice(0, PER_SEED_MAX))
        if (this.violations.length < TOTAL_MAX) this.violations.push({ ...v, seed: r.seed });
    }
    return !(this.firstFailingSeed !== null && this.o.stopAtFirstFailure);
  }
}

/**
 * A scenario the model cannot play (WRITE on a Mamba model) or a bad block size is a BAD_CONFIG here,
 * before any seed runs on a thread.
 */
export function checkPlayable(
  o: Pick<
    SimOptions,
    | 'scenario'
    | 'model'
    | 'requests'
    | 'mutant'
    | 'blockSize'
    | 'prefillBlockSize'
    | 'decodeBlockSize'
    | 'prefillTp'
    | 'decodeTp'
  >,
  seed = 1,
): void {
  buildScenario(o.scenario, o.model ?? DEFAULT_SIM_PRESET, seed, {
    requests: o.requests,
    mutant: o.mutant,
    ...blockSizeOptions(o),
    ...tensorParallelOf(o),
  });
}

/** The tensor parallel options of a run, only those set (worlds and scenarios default to 1). */
export function tensorParallelOf(o: Pick<SimOptions, 'prefillTp' | 'decodeTp'>): {
  prefillTp?: number;
  decodeTp?: number;
} {
  return {
    ...(o.prefillTp !== undefined ? { prefillTp: o.prefillTp } : {}),
    ...(o.decodeTp !== undefined ? { decodeTp: o.decodeTp } : {}),
  };
}

/**
 * The seed run when `--seed` is absent: dfs numbers schedules from 0 and a dpor search explores world 0
 * (dpor_run.ts), so a dpor replay or trace without `--seed` must run world 0 too; the others start at 1.
 */
export function defaultSeed(strategy: Strategy): number {
  return strategy === 'dfs' || strategy === 'dpor' ? 0 : 1;
}

/** `threads`: a pool shared by several runs (a sweep); its size is then the run's jobs. */
export async function runSim(
  o: SimOptions,
  wall: Env = new RealEnv(0),
  threads: SimThreads | null = null,
): Promise<SimReport> {
  // dpor is one search, not a list of seeds: it runs in this thread (dpor_run.ts).
  if (o.strategy === 'dpor' && !o.replay) return runDpor(o, wall);
  const first = o.seed ?? defaultSeed(o.strategy);
  checkPlayable(o, first);
  const count = o.replay ? 1 : o.seeds;
  const jobs = o.replay ? 1 : (threads?.size ?? o.jobs ?? 1);
  const t0 = wall.nowMs();
  const budgetMs = o.budgetS === undefined ? Infinity : o.budgetS * 1000;
  const { seeds: _s, onProgress: _p, jobs: _j, budgetS: _b, ...seedOptions } = o;
  const tally = new Tally(o);
  for await (const r of seedResults(seedOptions, first, count, jobs, () => wall.nowMs() - t0 < budgetMs, threads)) {
    const go = tally.add(r);
    o.onProgress?.(tally.done, count, tally.failing);
    if (!go) break;
  }
  const seconds = Math.max((wall.nowMs() - t0) / 1000, 1e-9);
  return {
    scenario: o.scenario,
    strategy: o.strategy,
    seeds: tally.ran,
    mutant: o.mutant ?? null,
    violations: tally.violations,
    firstFailingSeed: tally.firstFailingSeed,
    replay: tally.firstFailingSeed === null ? null : replayCommand(o, tally.firstFailingSeed),
    schedulesPerSec: Math.round((tally.ran / seconds) * 100) / 100,
    schedules: tally.ran,
    distinctSchedules: tally.hashes.size,
    jobs,
    wallSeconds: Math.round(seconds * 100) / 100,
    coverage: coverageReport(tally.coverage),
  };
}

/** The human summary `handoff sim` prints without --json. */
export function formatSimReport(r: SimReport): string {
  const head = `sim ${r.scenario} · ${r.strategy} · ${r.seeds} seed${r.seeds === 1 ? '' : 's'}${r.mutant ? ` · mutant ${r.mutant}` : ''} · ${r.schedulesPerSec} schedules/s`;
  if (r.firstFailingSeed === null)
    return `${head}\nPASS: no violation (race checker, page lifecycle I1-I7, P/D == colocated, liveness, leaks)\n${formatCoverage(r.coverage)}`;
  const failingSeeds = new Set(r.violations.map((v) => v.seed)).size;
  const lines = [head, `FAIL: ${failingSeeds}+ failing seed(s), first at seed ${r.firstFailingSeed}`];
  for (const v of r.violations.slice(0, 10))
    lines.push(
      `  seed ${v.seed} step ${v.step} @${v.atMs.toFixed(3)}ms [${v.oracle}${v.invariant ? ` ${v.invariant}` : ''}] ${v.message}`,
    );
  if (r.violations.length > 10) lines.push(`  ... ${r.violations.length - 10} more`);
  lines.push(`replay: ${r.replay}`, formatCoverage(r.coverage));
  return lines.join('\n');
}
