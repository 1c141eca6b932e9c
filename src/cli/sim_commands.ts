/** `handoff sim` and `handoff trace`: the deterministic simulator, its bug zoo and replay, and timelines. */
import { availableParallelism } from 'node:os';
import type { Command } from 'commander';
import cliProgress from 'cli-progress';
import { HandoffError } from '../util/errors.ts';
import { isMutantName, MUTANTS } from '../util/mutants.ts';
import { MODEL_PRESETS } from '../kv/presets.ts';
import { anyPresetFlag } from './flags.ts';
import {
  DEFAULT_SIM_PRESET,
  formatSimReport,
  isScenarioName,
  isStrategy,
  runSim,
  SCENARIOS,
  STRATEGIES,
  traceSim,
  writeTrace,
  type SimOptions,
  DPOR_DEPTH_DEFAULT,
  DPOR_MAX_SCHEDULES_DEFAULT,
  formatDporLine,
  runDpor,
} from '../sim/index.ts';

function intOpt(name: string, v: unknown, min: number, max: number): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isInteger(n) || n < min || n > max)
    throw new HandoffError('BAD_CONFIG', `--${name} must be an integer in [${min}, ${max}], got '${String(v)}'`);
  return n;
}

function simOptions(o: Record<string, unknown>): Omit<SimOptions, 'seeds'> & { seeds?: number } {
  const scenario = String(o['scenario']);
  if (!isScenarioName(scenario))
    throw new HandoffError('BAD_CONFIG', `unknown scenario '${scenario}' (${SCENARIOS.join(', ')})`);
  const strategy = String(o['strategy']);
  if (!isStrategy(strategy))
    throw new HandoffError('BAD_CONFIG', `unknown strategy '${strategy}' (${STRATEGIES.join(', ')})`);
  const model = anyPresetFlag(o['model']);
  const mutant = o['mutant'] === undefined ? undefined : String(o['mutant']);
  if (mutant !== undefined && !isMutantName(mutant))
    throw new HandoffError('BAD_CONFIG', `unknown mutant '${mutant}' (${Object.keys(MUTANTS).join(', ')})`);
  const opt = (k: string, min: number, max: number): number | undefined =>
    intOpt(
      k.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`),
      o[k],
      min,
      max,
    );
  return {
    scenario,
    strategy,
    model,
    ...(mutant ? { mutant } : {}),
    ...(opt('seed', 0, 2 ** 31) !== undefined ? { seed: opt('seed', 0, 2 ** 31) } : {}),
    ...(opt('seeds', 1, 1_000_000) !== undefined ? { seeds: opt('seeds', 1, 1_000_000) } : {}),
    ...(o['faults'] === false ? { faults: false } : {}),
    ...(opt('maxSteps', 1, 10_000_000) !== undefined ? { maxSteps: opt('maxSteps', 1, 10_000_000) } : {}),
    ...(opt('requests', 1, 1000) !== undefined ? { requests: opt('requests', 1, 1000) } : {}),
    ...(opt('pctDepth', 1, 100) !== undefined ? { pctDepth: opt('pctDepth', 1, 100) } : {}),
    ...(opt('dfsDepth', 1, 10_000) !== undefined ? { dfsDepth: opt('dfsDepth', 1, 10_000) } : {}),
    ...(opt('dporDepth', 0, 10_000) !== undefined ? { dporDepth: opt('dporDepth', 0, 10_000) } : {}),
    ...(opt('maxSchedules', 1, 10_000_000) !== undefined ? { maxSchedules: opt('maxSchedules', 1, 10_000_000) } : {}),
    ...(o['schedule'] !== undefined ? { schedule: parseSchedule(String(o['schedule'])) } : {}),
  };
}

/** `--schedule 0.2.1`: the index taken at each branching choice of a dpor schedule. */
function parseSchedule(s: string): number[] {
  const parts = s.split('.').map(Number);
  if (s === '' || !parts.every((n) => Number.isInteger(n) && n >= 0 && n < 10_000))
    throw new HandoffError('BAD_CONFIG', `--schedule must be dot-separated choice indices like 0.2.1, got '${s}'`);
  return parts;
}

function common(c: Command): Command {
  return c
    .option('--scenario <s>', SCENARIOS.join(' | '), '1p1d')
    .option('--strategy <s>', STRATEGIES.join(' | '), 'random')
    .option('--model <preset>', `model preset: ${MODEL_PRESETS.join(' | ')}`, DEFAULT_SIM_PRESET)
    .option('--mutant <m>', `reintroduce a known bug: ${Object.keys(MUTANTS).join(', ')}`)
    .option('--seed <n>', 'first seed (the seed to replay)')
    .option('--no-faults', 'turn off BUGGIFY fault injection')
    .option('--max-steps <n>', 'step budget per seed')
    .option('--requests <n>', 'requests per world')
    .option('--pct-depth <n>', 'PCT priority change points')
    .option('--dfs-depth <n>', 'bounded DFS depth')
    .option('--dpor-depth <n>', `dpor: branching choices explored per schedule (default ${DPOR_DEPTH_DEFAULT})`)
    .option('--max-schedules <n>', `dpor: schedules at most (default ${DPOR_MAX_SCHEDULES_DEFAULT})`)
    .option('--schedule <i.j.k>', 'dpor replay: the choice index at each branching point');
}

export function registerSimCommands(program: Command): void {
  common(
    program
      .command('sim')
      .description(
        'explore orderings of compute, zeroing and network deterministically; print one replay command per failure',
      ),
  )
    .option('--seeds <n>', 'how many seeds (schedules) to run (with --budget-s: at most; default unbounded)')
    .option('--jobs <n>', 'seed threads (default: the cores); the report is the same for any value')
    .option('--budget-s <s>', 'start seeds until this many seconds have passed')
    .option('--replay', 'run only --seed, exactly as the failure ran')
    .option('--json', 'print one JSON object')
    .action(async (o: Record<string, unknown>) => {
      const base = simOptions(o);
      const bar = new cliProgress.SingleBar(
        { stream: process.stderr, noTTYOutput: true, format: 'sim [{bar}] {value}/{total} seeds, {failing} failing' },
        cliProgress.Presets.shades_classic,
      );
      const budgetS = intOpt('budget-s', o['budgetS'], 1, 86_400);
      const seeds = base.seeds ?? (budgetS === undefined ? 20 : 1_000_000);
      const jobs = intOpt('jobs', o['jobs'], 1, 64) ?? availableParallelism();
      const dpor = base.strategy === 'dpor' && !o['replay'];
      bar.start(o['replay'] ? 1 : dpor ? (base.maxSchedules ?? DPOR_MAX_SCHEDULES_DEFAULT) : seeds, 0, { failing: 0 });
      const run = {
        ...base,
        seeds,
        jobs,
        ...(budgetS !== undefined ? { budgetS } : {}),
        ...(o['replay'] ? { replay: true } : {}),
        onProgress: (done: number, _total: number, failing: number) => bar.update(done, { failing }),
      };
      const dporReport = dpor ? await runDpor(run) : null;
      const report = dporReport ?? (await runSim(run));
      bar.stop();
      const human = `${formatSimReport(report)}${dporReport ? `\n${formatDporLine(dporReport)}` : ''}`;
      process.stdout.write(`${o['json'] ? JSON.stringify(report) : human}\n`);
      if (report.violations.length > 0) process.exitCode = 1;
    });
  common(
    program
      .command('trace')
      .description('run one sim seed and write a Chrome trace (Perfetto, speedscope) and an HTML timeline'),
  )
    .option('--out <base>', 'output path without extension', 'handoff-trace')
    .action(async (o: Record<string, unknown>) => {
      const base = simOptions(o);
      const { trace, result } = await traceSim(base, base.seed ?? 1);
      const files = writeTrace(trace, String(o['out']));
      process.stdout.write(
        `${files.json}\n${files.html}\n${result.violations.length} violation(s)${result.violations[0] ? `: ${result.violations[0].message}` : ''}\n`,
      );
    });
}
