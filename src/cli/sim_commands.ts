/** `handoff sim` and `handoff trace`: the deterministic simulator, its bug zoo and replay, and timelines. */
import { availableParallelism } from 'node:os';
import type { Command } from 'commander';
import cliProgress from 'cli-progress';
import { HandoffError } from '../util/errors.ts';
import { isMutantName, MUTANTS } from '../util/mutants.ts';
import { MODEL_PRESETS, type ModelPreset } from '../kv/presets.ts';
import {
  anyPresetFlag,
  blockSizeFlag,
  optionalInt,
  outputFilesFlag,
  pdTensorParallelFlags,
  traceBaseFlag,
} from './flags.ts';
import {
  DEFAULT_SIM_PRESET,
  defaultSeed,
  DPOR_DEPTH_DEFAULT,
  DPOR_MAX_SCHEDULES_DEFAULT,
  formatDporLine,
  formatSimReport,
  isScenarioName,
  isStrategy,
  runSim,
  SCENARIOS,
  STRATEGIES,
  traceFiles,
  traceSim,
  writeTrace,
  type SimOptions,
  type ScenarioName,
  type Strategy,
} from '../sim/index.ts';
import { formatSweepReport, runSweep } from '../sim/sweep.ts';

/** `--scenario all | a,b` and `--strategy a,b`: the pairs of a sweep (one pair: a plain run). */
function simLists(o: Record<string, unknown>): { scenarios: ScenarioName[]; strategies: Strategy[] } {
  const list = (v: unknown): string[] =>
    String(v)
      .split(',')
      .map((x) => x.trim())
      .filter((x) => x.length > 0);
  const scenarios = String(o['scenario']) === 'all' ? [...SCENARIOS] : list(o['scenario']);
  for (const s of scenarios)
    if (!isScenarioName(s))
      throw new HandoffError('BAD_CONFIG', `unknown scenario '${s}' (${SCENARIOS.join(', ')}, all)`);
  const strategies = list(o['strategy']);
  for (const s of strategies)
    if (!isStrategy(s)) throw new HandoffError('BAD_CONFIG', `unknown strategy '${s}' (${STRATEGIES.join(', ')})`);
  if (scenarios.length === 0 || strategies.length === 0)
    throw new HandoffError('BAD_CONFIG', '--scenario and --strategy need at least one name');
  return { scenarios: scenarios as ScenarioName[], strategies: strategies as Strategy[] };
}

async function simSweep(
  o: Record<string, unknown>,
  lists: { scenarios: ScenarioName[]; strategies: Strategy[] },
  run: { seeds: number; jobs: number; budgetS?: number },
): Promise<void> {
  if (o['replay']) throw new HandoffError('BAD_CONFIG', '--replay runs one scenario and strategy');
  // A sweep searches; it never replays a schedule (ignoring it ran every pair's search instead).
  if (o['schedule'] !== undefined)
    throw new HandoffError('BAD_CONFIG', '--schedule replays one dpor schedule: one scenario and strategy');
  const {
    scenario: _a,
    strategy: _b,
    ...base
  } = simOptions({ ...o, scenario: lists.scenarios[0], strategy: lists.strategies[0] });
  const report = await runSweep({
    ...base,
    ...lists,
    ...run,
    onRun: (r) =>
      process.stderr.write(
        `${r.scenario} ${r.strategy}: ${r.schedules} schedules, ${r.violations.length === 0 ? 'ok' : 'VIOLATIONS'}\n`,
      ),
  });
  process.stdout.write(`${o['json'] ? JSON.stringify(report) : formatSweepReport(report)}\n`);
  if (report.failingRuns > 0) process.exitCode = 1;
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
    optionalInt(
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
    ...(o['blockSize'] !== undefined ? { blockSize: blockSizeFlag(o['blockSize']) } : {}),
    ...(o['prefillBlockSize'] !== undefined
      ? { prefillBlockSize: blockSizeFlag(o['prefillBlockSize'], 'prefill-block-size') }
      : {}),
    ...(o['decodeBlockSize'] !== undefined
      ? { decodeBlockSize: blockSizeFlag(o['decodeBlockSize'], 'decode-block-size') }
      : {}),
    ...simTensorParallel(model, o),
    ...(o['asyncRead'] === true ? { asyncRead: true } : {}),
    ...(opt('dporDepth', 0, 10_000) !== undefined ? { dporDepth: opt('dporDepth', 0, 10_000) } : {}),
    ...(opt('maxSchedules', 1, 10_000_000) !== undefined ? { maxSchedules: opt('maxSchedules', 1, 10_000_000) } : {}),
    ...(o['schedule'] !== undefined ? { schedule: parseSchedule(String(o['schedule']), strategy) } : {}),
  };
}

/**
 * `--prefill-tp`/`--decode-tp` (or `--tensor-parallel-size` for both): set when a flag names them, 1 too
 * (hetero-tp draws its degrees only when none is named; dropping an explicit 1/1 ran drawn ones instead).
 */
function simTensorParallel(model: ModelPreset, o: Record<string, unknown>): { prefillTp?: number; decodeTp?: number } {
  const { prefill, decode } = pdTensorParallelFlags(model, o);
  const named = ['tensorParallelSize', 'prefillTp', 'decodeTp'].some((k) => o[k] !== undefined);
  return !named ? {} : { prefillTp: prefill, decodeTp: decode };
}

/** `--schedule 0.2.1`: the index taken at each branching choice of a dpor schedule (each a plain decimal < 10000). */
function parseSchedule(s: string, strategy: Strategy): number[] {
  if (strategy !== 'dpor')
    throw new HandoffError('BAD_CONFIG', `--schedule is a dpor schedule; --strategy is ${strategy}`);
  if (!/^(0|[1-9][0-9]{0,3})(\.(0|[1-9][0-9]{0,3}))*$/.test(s))
    throw new HandoffError('BAD_CONFIG', `--schedule must be dot-separated choice indices like 0.2.1, got '${s}'`);
  return s.split('.').map(Number);
}

function common(c: Command): Command {
  return c
    .option('--scenario <s>', `${SCENARIOS.join(' | ')}; sim: a list or all`, '1p1d')
    .option('--strategy <s>', `${STRATEGIES.join(' | ')}; sim: a list`, 'random')
    .option('--model <preset>', `model preset: ${MODEL_PRESETS.join(' | ')}`, DEFAULT_SIM_PRESET)
    .option('--mutant <m>', `reintroduce a known bug: ${Object.keys(MUTANTS).join(', ')}`)
    .option('--seed <n>', 'first seed (the seed to replay)')
    .option('--no-faults', 'turn off BUGGIFY fault injection')
    .option('--max-steps <n>', 'step budget per seed')
    .option('--requests <n>', 'requests per world')
    .option('--block-size <n>', 'tokens per KV page on both instances (default 16; hetero-block: from the seed)')
    .option('--prefill-block-size <n>', 'tokens per KV page of the prefill instance (wins over --block-size)')
    .option('--decode-block-size <n>', 'tokens per KV page of the decode instance (wins over --block-size)')
    .option('--tensor-parallel-size <n>', 'tensor parallel ranks of both instances (1 or 2)')
    .option('--prefill-tp <n>', 'tensor parallel ranks of prefill (may differ from decode)')
    .option('--decode-tp <n>', 'tensor parallel ranks of decode (may differ from prefill)')
    .option('--async-read', 'READ scenarios: decode loads asynchronously, as serving does by default')
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
      const lists = simLists(o);
      const budgetS = optionalInt('budget-s', o['budgetS'], 1, 86_400);
      const seeds = optionalInt('seeds', o['seeds'], 1, 1_000_000) ?? (budgetS === undefined ? 20 : 1_000_000);
      const jobs = optionalInt('jobs', o['jobs'], 1, 64) ?? availableParallelism();
      if (lists.scenarios.length * lists.strategies.length > 1)
        return simSweep(o, lists, { seeds, jobs, ...(budgetS !== undefined ? { budgetS } : {}) });
      const base = simOptions(o);
      // A schedule is replayed, never searched from: ignoring it ran the whole dpor search instead.
      if (base.schedule !== undefined && !o['replay'])
        throw new HandoffError('BAD_CONFIG', '--schedule replays one dpor schedule: add --replay');
      const bar = new cliProgress.SingleBar(
        { stream: process.stderr, noTTYOutput: true, format: 'sim [{bar}] {value}/{total} seeds, {failing} failing' },
        cliProgress.Presets.shades_classic,
      );
      const dpor = base.strategy === 'dpor' && !o['replay'];
      bar.start(o['replay'] ? 1 : dpor ? (base.maxSchedules ?? DPOR_MAX_SCHEDULES_DEFAULT) : seeds, 0, { failing: 0 });
      const report = await runSim({
        ...base,
        seeds,
        jobs,
        ...(budgetS !== undefined ? { budgetS } : {}),
        ...(o['replay'] ? { replay: true } : {}),
        onProgress: (done, _total, failing) => bar.update(done, { failing }),
      });
      bar.stop();
      const dporLine = formatDporLine(report);
      const human = `${formatSimReport(report)}${dporLine === null ? '' : `\n${dporLine}`}`;
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
      const out = traceBaseFlag('out', o['out']);
      const files = traceFiles(out);
      outputFilesFlag('out', [files.json, files.html]);
      const { trace, result } = await traceSim(base, base.seed ?? defaultSeed(base.strategy));
      writeTrace(trace, out);
      process.stdout.write(
        `${files.json}\n${files.html}\n${result.violations.length} violation(s)${result.violations[0] ? `: ${result.violations[0].message}` : ''}\n`,
      );
    });
}
