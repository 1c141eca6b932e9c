/**
 * `handoff sim --strategy dpor`: explore every schedule of the world up to the bounds, judge each
 * with the oracles, and report like `runSim` (DESIGN.md §10 keys) plus `schedules`, `exhausted` and
 * `bound`. Schedules are numbered 0, 1, ... in search order (the report's "seeds"); a failure's
 * replay runs exactly its schedule: `--strategy dpor --schedule 0.2.1 --replay`. The world is seed
 * `--seed` (default 0): the scenario's draws (hetero-tp's mode, degrees and sizes) come from it.
 */
import { RealEnv, type Env } from '../util/env.ts';
import { DporSearch, type DporSystem } from './dpor.ts';
import { DporWorldExplorer } from './dpor_world.ts';
import { coverageReport, mergeCounts, type OrderCounts } from './coverage.ts';
import { judgeEnd } from './oracles.ts';
import {
  DEFAULT_SIM_PRESET,
  replayCommand,
  tensorParallelOf,
  type SimOptions,
  type SimReport,
  type SimViolation,
} from './run_sim.ts';
import { SimWorld, type Violation } from './world.ts';
import { blockSizeOptions } from './scenarios.ts';

export const DPOR_DEPTH_DEFAULT = 40;
export const DPOR_MAX_SCHEDULES_DEFAULT = 10_000;

export interface DporReport extends SimReport {
  exhausted: boolean;
  bound: { depth: number; maxSchedules: number; depthCut: boolean; capped: boolean };
  sleepBlocked: number;
}

const PER_SCHEDULE_MAX = 3;
const TOTAL_MAX = 50;

export async function runDpor(o: SimOptions, wall: Env = new RealEnv(0)): Promise<DporReport> {
  const depth = o.dporDepth ?? DPOR_DEPTH_DEFAULT;
  const maxSchedules = o.maxSchedules ?? DPOR_MAX_SCHEDULES_DEFAULT;
  const coverage: OrderCounts = {};
  const worldSeed = o.seed ?? 0;
  const system: DporSystem<Violation[]> = {
    execute: async (chooser) => {
      const world = await SimWorld.create({
        scenario: o.scenario,
        preset: o.model ?? DEFAULT_SIM_PRESET,
        seed: worldSeed,
        strategy: 'dpor',
        ...(o.mutant ? { mutant: o.mutant } : {}),
        faults: false,
        ...(o.maxSteps !== undefined ? { maxSteps: o.maxSteps } : {}),
        ...(o.requests !== undefined ? { requests: o.requests } : {}),
        ...blockSizeOptions(o),
        ...tensorParallelOf(o),
        ...(o.asyncRead === true ? { asyncRead: true } : {}),
        makeExplorer: (w) => new DporWorldExplorer(w, chooser),
      });
      await world.run();
      await judgeEnd(world);
      await world.shutdown();
      mergeCounts(coverage, world.coverage.finish());
      return world.violations;
    },
  };
  const search = new DporSearch(system, { depth, maxSchedules });
  const violations: SimViolation[] = [];
  let firstFailing: { n: number; schedule: number[] } | null = null;
  let failing = 0;
  const t0 = wall.nowMs();
  const stats = await search.run((vs, schedule) => {
    const n = search.stats.schedules - 1;
    if (vs.length > 0) {
      failing++;
      firstFailing ??= { n, schedule: [...schedule] };
      for (const v of vs.slice(0, PER_SCHEDULE_MAX))
        if (violations.length < TOTAL_MAX) violations.push({ ...v, seed: n });
    }
    o.onProgress?.(n + 1, maxSchedules, failing);
    const overBudget = o.budgetS !== undefined && wall.nowMs() - t0 >= o.budgetS * 1000;
    return overBudget || (firstFailing !== null && o.stopAtFirstFailure === true);
  });
  const seconds = Math.max((wall.nowMs() - t0) / 1000, 1e-9);
  const first = firstFailing as { n: number; schedule: number[] } | null;
  return {
    scenario: o.scenario,
    strategy: 'dpor',
    seeds: stats.schedules,
    mutant: o.mutant ?? null,
    violations,
    firstFailingSeed: first?.n ?? null,
    replay:
      first === null
        ? null
        : replayCommand({ ...o, strategy: 'dpor', faults: false, schedule: first.schedule }, worldSeed),
    schedulesPerSec: Math.round((stats.schedules / seconds) * 100) / 100,
    schedules: stats.schedules,
    // Every execution differs from the earlier ones at its branch node.
    distinctSchedules: stats.schedules,
    jobs: 1,
    wallSeconds: Math.round(seconds * 100) / 100,
    coverage: coverageReport(coverage),
    exhausted: stats.exhausted,
    bound: { depth, maxSchedules, depthCut: stats.depthCut, capped: stats.capped },
    sleepBlocked: stats.sleepBlocked,
  };
}

function isDporReport(r: SimReport): r is DporReport {
  return 'exhausted' in r && 'bound' in r;
}

/** The human summary's extra line for a dpor run (null for other strategies). */
export function formatDporLine(report: SimReport): string | null {
  if (!isDporReport(report)) return null;
  const r = report;
  const how = r.exhausted
    ? 'space exhausted'
    : `NOT exhausted (${[r.bound.capped ? `stopped at ${r.schedules} schedules` : '', r.bound.depthCut ? `depth bound ${r.bound.depth} cut branches` : ''].filter((x) => x).join(', ')})`;
  return `dpor: ${r.schedules} schedules, ${how}, depth bound ${r.bound.depth}, ${r.sleepBlocked} sleep-blocked`;
}
