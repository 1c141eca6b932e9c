/**
 * `handoff sim`: run a scenario over many seeds, judge every run with the oracles, and report in the
 * contract of DESIGN.md §10: {scenario, strategy, seeds, mutant, violations, firstFailingSeed, replay,
 * schedulesPerSec}. Every failure comes with one command that replays it exactly.
 */
import { RealEnv, type Env } from '../util/env.ts';
import type { MutantName } from '../util/mutants.ts';
import type { ModelPreset } from '../kv/presets.ts';
import type { Strategy } from './explorer.ts';
import { coverageReport, formatCoverage, mergeCounts, type CoverageReport, type OrderCounts } from './coverage.ts';
import { judgeEnd } from './oracles.ts';
import type { ScenarioName } from './scenarios.ts';
import type { SimTrace } from './trace.ts';
import { DEFAULT_MAX_STEPS, SimWorld, type Violation } from './world.ts';

export interface SimOptions {
  scenario: ScenarioName;
  strategy: Strategy;
  /** How many seeds to run, from `seed` on. */
  seeds: number;
  /** First seed (default 1; dfs schedules are numbered from 0). */
  seed?: number;
  mutant?: MutantName;
  /** Model preset (default dsv4-mini). */
  model?: ModelPreset;
  /** Run only `seed`, with a trace (the replay of a failure). */
  replay?: boolean;
  /** Stop at the first failing seed (the bug zoo's seeds-to-catch). */
  stopAtFirstFailure?: boolean;
  faults?: boolean;
  maxSteps?: number;
  requests?: number;
  pctDepth?: number;
  dfsDepth?: number;
  /** dpor (dpor_run.ts): branching choices explored, schedules at most; a replay's schedule. */
  dporDepth?: number;
  maxSchedules?: number;
  schedule?: readonly number[];
  onProgress?: (done: number, total: number, failingSeeds: number) => void;
}

export interface SimViolation extends Violation {
  seed: number;
}

/** Exactly the keys of DESIGN.md §10. */
export interface SimReport {
  scenario: ScenarioName;
  strategy: Strategy;
  seeds: number;
  mutant: MutantName | null;
  violations: SimViolation[];
  firstFailingSeed: number | null;
  replay: string | null;
  schedulesPerSec: number;
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
    | 'schedule'
  >,
  seed: number,
): string {
  const parts = ['handoff sim', `--scenario ${o.scenario}`, `--strategy ${o.strategy}`, `--seed ${seed}`];
  if (o.mutant) parts.push(`--mutant ${o.mutant}`);
  if (o.model && o.model !== 'dsv4-mini') parts.push(`--model ${o.model}`);
  if (o.faults === false) parts.push('--no-faults');
  if (o.maxSteps !== undefined && o.maxSteps !== DEFAULT_MAX_STEPS) parts.push(`--max-steps ${o.maxSteps}`);
  if (o.requests !== undefined) parts.push(`--requests ${o.requests}`);
  if (o.pctDepth !== undefined) parts.push(`--pct-depth ${o.pctDepth}`);
  if (o.dfsDepth !== undefined) parts.push(`--dfs-depth ${o.dfsDepth}`);
  if (o.schedule !== undefined) parts.push(`--schedule ${o.schedule.join('.') || '0'}`);
  parts.push('--replay');
  return parts.join(' ');
}

/** One seed, start to judgement. */
export async function runSeed(
  o: Omit<SimOptions, 'seeds' | 'onProgress'>,
  seed: number,
  trace: boolean,
): Promise<SeedResult> {
  // A traced run goes on after the first violation, so the timeline shows the racing pair execute.
  const world = await SimWorld.create({
    scenario: o.scenario,
    preset: o.model ?? 'dsv4-mini',
    seed,
    strategy: o.strategy,
    ...(o.mutant ? { mutant: o.mutant } : {}),
    ...(o.faults !== undefined ? { faults: o.faults } : {}),
    ...(o.maxSteps !== undefined ? { maxSteps: o.maxSteps } : {}),
    ...(o.requests !== undefined ? { requests: o.requests } : {}),
    explorer: { pctDepth: o.pctDepth, dfsDepth: o.dfsDepth, ...(o.schedule ? { schedule: o.schedule } : {}) },
    trace,
    stopOnViolation: !trace,
  });
  await world.run();
  await judgeEnd(world);
  await world.shutdown();
  const title = `${o.scenario} ${o.strategy} seed ${seed}${o.mutant ? ` mutant ${o.mutant}` : ''} (${o.model ?? 'dsv4-mini'})`;
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

export async function runSim(o: SimOptions, wall: Env = new RealEnv(0)): Promise<SimReport> {
  const first = o.seed ?? (o.strategy === 'dfs' ? 0 : 1);
  const count = o.replay ? 1 : o.seeds;
  const violations: SimViolation[] = [];
  let firstFailingSeed: number | null = null;
  let ran = 0;
  let failing = 0;
  let duplicatesInARow = 0;
  const coverage: OrderCounts = {};
  const t0 = wall.nowMs();
  for (let k = 0; k < count; k++) {
    const seed = first + k;
    const r = await runSeed(o, seed, o.replay === true);
    if (r.duplicate && !o.replay) {
      // dfs: a schedule already run. Many in a row: the bounded space is exhausted.
      if (++duplicatesInARow >= DFS_DUPLICATES_MAX) break;
      continue;
    }
    duplicatesInARow = 0;
    ran++;
    mergeCounts(coverage, r.coverage);
    if (r.violations.length > 0) {
      failing++;
      firstFailingSeed ??= seed;
      for (const v of r.violations.slice(0, PER_SEED_MAX))
        if (violations.length < TOTAL_MAX) violations.push({ ...v, seed });
    }
    o.onProgress?.(k + 1, count, failing);
    if (firstFailingSeed !== null && o.stopAtFirstFailure) break;
  }
  const seconds = Math.max((wall.nowMs() - t0) / 1000, 1e-9);
  return {
    scenario: o.scenario,
    strategy: o.strategy,
    seeds: ran,
    mutant: o.mutant ?? null,
    violations,
    firstFailingSeed,
    replay: firstFailingSeed === null ? null : replayCommand(o, firstFailingSeed),
    schedulesPerSec: Math.round((ran / seconds) * 100) / 100,
    coverage: coverageReport(coverage),
  };
}

/** The human summary `handoff sim` prints without --json. */
export function formatSimReport(r: SimReport): string {
  const head = `sim ${r.scenario} · ${r.strategy} · ${r.seeds} seed${r.seeds === 1 ? '' : 's'}${r.mutant ? ` · mutant ${r.mutant}` : ''} · ${r.schedulesPerSec} schedules/s`;
  if (r.firstFailingSeed === null)
    return `${head}\nPASS: no violation (race checker, page lifecycle I1-I6, P/D == colocated, liveness, leaks)\n${formatCoverage(r.coverage)}`;
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
