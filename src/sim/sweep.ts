/**
 * `handoff sim --scenario all --strategy random,pct`: every (scenario, strategy) pair in one process on
 * one pool of seed threads (started once: a thread loads the whole engine), each pair a `runSim` with
 * its own report, plus the totals CI reads: schedules run, distinct schedules, wall time, failing runs.
 */
import { RealEnv, type Env } from '../util/env.ts';
import type { Strategy } from './explorer.ts';
import { HandoffError, isHandoffError } from '../util/errors.ts';
import { checkPlayable, formatSimReport, runSim, type SimOptions, type SimReport } from './run_sim.ts';
import type { ScenarioName } from './scenarios.ts';
import { SimThreads } from './sim_threads.ts';

export interface SweepOptions extends Omit<SimOptions, 'scenario' | 'strategy' | 'onProgress' | 'replay'> {
  scenarios: readonly ScenarioName[];
  strategies: readonly Strategy[];
  /** Called after each pair. */
  onRun?: (r: SimReport) => void;
}

export interface SweepReport {
  runs: SimReport[];
  /** Scenarios the model cannot play (WRITE on a Mamba model), left out with the reason. */
  skipped: Array<{ scenario: ScenarioName; reason: string }>;
  schedules: number;
  distinctSchedules: number;
  failingRuns: number;
  jobs: number;
  wallSeconds: number;
  schedulesPerSec: number;
}

/** Why the model cannot play `scenario` (its BAD_CONFIG message), or null. */
function unplayable(scenario: ScenarioName, o: SweepOptions): string | null {
  try {
    checkPlayable({ ...o, scenario });
    return null;
  } catch (e) {
    if (isHandoffError(e) && e.code === 'BAD_CONFIG') return e.message;
    throw e;
  }
}

export async function runSweep(o: SweepOptions, wall: Env = new RealEnv(0)): Promise<SweepReport> {
  const jobs = o.jobs ?? 1;
  const skipped: SweepReport['skipped'] = [];
  const playable = o.scenarios.filter((scenario) => {
    const reason = unplayable(scenario, o);
    if (reason !== null) skipped.push({ scenario, reason });
    return reason === null;
  });
  // Nothing to run is no pass: a sweep of only unplayable scenarios exited 0 with "no violation".
  if (playable.length === 0)
    throw new HandoffError('BAD_CONFIG', `no scenario can be played: ${skipped.map((k) => k.reason).join('; ')}`);
  const threads = jobs > 1 ? new SimThreads(jobs) : null;
  const pairs = playable.flatMap((scenario) => o.strategies.map((strategy) => ({ scenario, strategy })));
  // A time budget is shared evenly by the pairs.
  const budgetS = o.budgetS === undefined ? undefined : o.budgetS / Math.max(1, pairs.length);
  const { scenarios: _s, strategies: _t, onRun: _r, ...common } = o;
  const runs: SimReport[] = [];
  const t0 = wall.nowMs();
  try {
    for (const p of pairs) {
      const r = await runSim({ ...common, ...p, ...(budgetS !== undefined ? { budgetS } : {}) }, wall, threads);
      runs.push(r);
      o.onRun?.(r);
    }
  } finally {
    await threads?.close();
  }
  const seconds = Math.max((wall.nowMs() - t0) / 1000, 1e-9);
  const schedules = runs.reduce((n, r) => n + r.schedules, 0);
  return {
    runs,
    skipped,
    schedules,
    distinctSchedules: runs.reduce((n, r) => n + r.distinctSchedules, 0),
    failingRuns: runs.filter((r) => r.firstFailingSeed !== null).length,
    jobs,
    wallSeconds: Math.round(seconds * 100) / 100,
    schedulesPerSec: Math.round((schedules / seconds) * 100) / 100,
  };
}

export function formatSweepReport(s: SweepReport): string {
  const lines = s.runs.map((r) =>
    r.firstFailingSeed === null
      ? `PASS ${r.scenario} · ${r.strategy} · ${r.schedules} schedules · ${r.schedulesPerSec}/s`
      : formatSimReport(r),
  );
  for (const k of s.skipped) lines.push(`SKIP ${k.scenario}: ${k.reason}`);
  lines.push(
    `sweep: ${s.runs.length} runs, ${s.schedules} schedules (${s.distinctSchedules} distinct) in ${s.wallSeconds} s on ${s.jobs} thread(s) = ${s.schedulesPerSec} schedules/s; ${s.failingRuns === 0 ? 'no violation' : `${s.failingRuns} failing run(s)`}`,
  );
  return lines.join('\n');
}
