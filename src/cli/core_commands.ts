/**
 * `handoff ab` and `handoff bench transfer|model|sched` (transfer in bench_transfer.ts): the core measurements,
 * human output or --json.
 * `handoff ab` exits 1 when a variant with the fix mismatches or races (ab_gate.ts), so it can gate CI.
 */
import type { Command } from 'commander';
import cliProgress from 'cli-progress';
import { assert } from '../util/assert.ts';
import { RealEnv } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import {
  anyPresetFlag,
  blockSizeFlag,
  intFlag,
  outputFilesFlag,
  pdTensorParallelFlags,
  presetFlag,
  tensorParallelFlag,
  traceBaseFlag,
} from './flags.ts';
import { registerBenchTransfer } from './bench_transfer.ts';
import { benchModel, benchTensorParallel } from '../model/bench.ts';
import { benchSched } from '../engine/bench_sched.ts';
import { runAb, AB_VARIANTS, type AbVariant, type AbReport } from '../sim/ab.ts';
import { abVerdict, type AbVerdict } from '../sim/ab_gate.ts';
import { traceFiles, writeTrace } from '../sim/trace_export.ts';

const out = (s: string): void => void process.stdout.write(`${s}\n`);

/** `--variant a,b`: the named A/B variants, in the order given. */
function abVariants(list: string): AbVariant[] {
  const names = list
    .split(',')
    .map((n) => n.trim())
    .filter((n) => n.length > 0);
  if (names.length === 0) throw new HandoffError('BAD_CONFIG', '--variant needs at least one name');
  return [...new Set(names)].map((n) => {
    const v = AB_VARIANTS.find((x) => x.name === n);
    if (v === undefined)
      throw new HandoffError('BAD_CONFIG', `unknown variant '${n}' (${AB_VARIANTS.map((x) => x.name).join(', ')})`);
    return v;
  });
}

/** `handoff ab` and `handoff bench …`; returns the `bench` command so callers can add subcommands. */
export function registerCoreCommands(program: Command): Command {
  registerAb(program);
  const bench = program
    .command('bench')
    .description('benchmarks, as ratios against a baseline measured in the same run');
  registerBenchTransfer(bench);
  registerBenchModel(bench);
  registerBenchSched(bench);
  return bench;
}

function registerAb(program: Command): void {
  program
    .command('ab')
    .description(
      'end-to-end A/B of the zeroing-vs-READ race: colocated reference vs 1P1D per zeroing variant (real threads)',
    )
    .option('--model <preset>', 'model preset', 'dsv4-mini')
    .option('--requests <n>', 'number of prompts', '24')
    .option('--max-tokens <n>', 'tokens generated per request', '8')
    .option('--seed <n>', 'seed for prompts and weights', '1')
    .option('--arrival-gap-ms <n>', 'gap between request arrivals', '3')
    .option('--forward-pad-ms <n>', 'keep the decode stream busy this long after each forward (a bigger model)', '0')
    .option('--block-size <n>', 'tokens per KV page on both instances (default 16)')
    .option('--prefill-block-size <n>', 'tokens per KV page of the prefill instance (wins over --block-size)')
    .option('--decode-block-size <n>', 'tokens per KV page of the decode instance (wins over --block-size)')
    .option('--variant <names>', `comma list of variants to run (${AB_VARIANTS.map((v) => v.name).join(', ')})`)
    .option('--tensor-parallel-size <n>', 'tensor parallel ranks of each pair (reference: colocated TP=1)')
    .option('--prefill-tp <n>', 'tensor parallel ranks of prefill (may differ from decode)')
    .option('--decode-tp <n>', 'tensor parallel ranks of decode (may differ from prefill)')
    .option('--async-read', "decode loads asynchronously (async_read): the race and the fix with vLLM NIXL's loads")
    .option(
      '--trace <base>',
      "write the decode instance's timeline as <base>.json (Chrome trace) and <base>.html (<base>-<variant>.* for several variants)",
    )
    .option('--json', 'print one JSON object')
    .action(runAbCommand);
}

async function runAbCommand(o: Record<string, string | boolean>): Promise<void> {
  const env = new RealEnv(intFlag('seed', String(o['seed']), 0, 2 ** 31));
  const requests = intFlag('requests', String(o['requests']), 1, 1000);
  const variants = o['variant'] === undefined ? AB_VARIANTS : abVariants(String(o['variant']));
  const traceBase = o['trace'] === undefined ? null : traceBaseFlag('trace', o['trace']);
  // A bad --trace path is refused before the run, not after it.
  if (traceBase !== null) outputFilesFlag('trace', abTraceFiles(traceBase, variants));
  const bar = new cliProgress.SingleBar(
    { stream: process.stderr, noTTYOutput: true, format: '{variant} [{bar}] {value}/{total}' },
    cliProgress.Presets.shades_classic,
  );
  const preset = presetFlag(o['model']);
  const tp = pdTensorParallelFlags(preset, o);
  bar.start(requests * variants.length, 0, { variant: 'reference' });
  let base = 0;
  let last = '';
  const report = await runAb(
    {
      preset,
      requests,
      maxTokens: intFlag('max-tokens', String(o['maxTokens']), 1, 256),
      seed: intFlag('seed', String(o['seed']), 0, 2 ** 31),
      arrivalGapMs: intFlag('arrival-gap-ms', String(o['arrivalGapMs']), 0, 10_000),
      forwardPadMs: intFlag('forward-pad-ms', String(o['forwardPadMs']), 0, 10_000),
      ...abBlockSizes(o),
      prefillTp: tp.prefill,
      decodeTp: tp.decode,
      asyncRead: o['asyncRead'] === true,
      variants,
      trace: traceBase !== null,
      onProgress: (variant, done) => {
        if (variant !== last) {
          if (last !== '') base += requests;
          last = variant;
        }
        bar.update(base + done, { variant });
      },
    },
    env,
  );
  bar.stop();
  if (traceBase !== null) writeAbTraces(report, traceBase, Boolean(o['json']));
  const verdict = abVerdict(
    report.variants.map((r) => {
      const def = variants.find((x) => x.name === r.name);
      assert(def !== undefined, `A/B result for unknown variant ${r.name}`);
      return { ...r, zeroExclusion: def.zeroExclusion };
    }),
  );
  if (!verdict.ok) process.exitCode = 1;
  if (o['json']) printAbJson(report, verdict);
  else printAbTable(report, verdict);
}

/** `--block-size` for both sides, `--prefill-block-size` / `--decode-block-size` for one (they win). */
function abBlockSizes(o: Record<string, string | boolean>): { prefillBlockSize?: number; decodeBlockSize?: number } {
  const both = o['blockSize'] === undefined ? undefined : blockSizeFlag(o['blockSize']);
  const prefill =
    o['prefillBlockSize'] === undefined ? both : blockSizeFlag(o['prefillBlockSize'], 'prefill-block-size');
  const decode = o['decodeBlockSize'] === undefined ? both : blockSizeFlag(o['decodeBlockSize'], 'decode-block-size');
  return {
    ...(prefill !== undefined ? { prefillBlockSize: prefill } : {}),
    ...(decode !== undefined ? { decodeBlockSize: decode } : {}),
  };
}

/** Each variant's trace base: `<base>` for one variant, `<base>-<variant>` for several. */
function abTraceBase(traceBase: string, variant: string, count: number): string {
  const stem = traceBase.replace(/\.(json|html)$/, '');
  return count === 1 ? stem : `${stem}-${variant}`;
}

/** Every file `writeAbTraces` may write for these variants. */
function abTraceFiles(traceBase: string, variants: readonly AbVariant[]): string[] {
  return variants.flatMap((v) => Object.values(traceFiles(abTraceBase(traceBase, v.name, variants.length))));
}

function writeAbTraces(report: AbReport, traceBase: string, json: boolean): void {
  for (const v of report.variants) {
    if (v.trace === null) continue;
    const files = writeTrace(v.trace, abTraceBase(traceBase, v.name, report.variants.length));
    // With --json, stdout carries only the JSON object.
    (json ? process.stderr : process.stdout).write(
      `trace of ${v.name} (decode instance): ${files.json} (Perfetto, chrome://tracing, speedscope), ${files.html}\n`,
    );
  }
}

function printAbJson(report: AbReport, verdict: AbVerdict): void {
  const gate = { ok: verdict.ok, gating: verdict.gating, failures: verdict.failures };
  out(
    JSON.stringify({
      ...report,
      gate,
      variants: report.variants.map(({ name, exactMatch, mismatchedRequests, races, tokensPerSec, itlMsP50 }) => ({
        name,
        exactMatch,
        mismatchedRequests,
        races,
        tokensPerSec,
        itlMsP50,
      })),
    }),
  );
  if (!verdict.ok) process.stderr.write(`handoff ab: ${verdict.summary}\n`);
}

function printAbTable(report: AbReport, verdict: AbVerdict): void {
  const sizes = `prefill ${report.prefillBlockSize} / decode ${report.decodeBlockSize} tokens per page`;
  const [ptp, dtp] = [report.prefillTensorParallelSize, report.tensorParallelSize];
  const tp =
    ptp !== dtp
      ? `, prefill TP=${ptp} / decode TP=${dtp}, reference at TP=1`
      : dtp > 1
        ? `, TP=${dtp} each, reference at TP=1`
        : '';
  out(`handoff ab: ${report.model}, ${report.requests} requests, colocated reference vs 1P1D READ (${sizes}${tp})`);
  const fast = report.variants.find((v) => v.name === 'all-read-groups');
  for (const v of report.variants) {
    const ratio =
      fast && fast.tokensPerSec > 0 ? ` (${(v.tokensPerSec / fast.tokensPerSec).toFixed(2)}x of all-read-groups)` : '';
    out(
      `  ${v.name.padEnd(32)} exact ${String(v.exactMatch).padStart(4)}/${report.requests}  mismatched ${String(v.mismatchedRequests).padStart(4)}  races ${String(v.races).padStart(5)}  ` +
        `${v.tokensPerSec.toFixed(1)} tok/s${ratio}  ITL p50 ${v.itlMsP50.toFixed(1)} ms  zeroed ${v.pagesZeroed} excluded ${v.pagesExcludedFromZeroing}` +
        `${v.tailsZeroed > 0 ? ` tails ${v.tailsZeroed}` : ''}${v.loadFailures > 0 ? `  load failures ${v.loadFailures}` : ''}`,
    );
  }
  out(verdict.summary);
}

function registerBenchModel(bench: Command): void {
  bench
    .command('model')
    .description('forward throughput vs a plain TS matmul roofline measured in the same run')
    .option('--model <preset>', 'model preset (micro presets too)', 'dsv4-mini')
    .option('--tokens <n>', 'decode tokens', '64')
    .option(
      '--tensor-parallel-size <n>',
      'also run the workload on the threaded device at TP=1 and TP=n (ranks as compute threads), same run',
    )
    .option('--reps <n>', 'alternating TP=1 / TP=n runs (median of each)', '3')
    .option('--json', 'print one JSON object')
    .action(async (o: Record<string, string | boolean>) => {
      const preset = anyPresetFlag(o['model']);
      const tokens = intFlag('tokens', String(o['tokens']), 1, 100_000);
      const r = await benchModel({ preset, env: new RealEnv(), tokens });
      const tp =
        o['tensorParallelSize'] === undefined
          ? null
          : await benchTensorParallel({
              preset,
              env: new RealEnv(),
              tokens,
              tensorParallelSize: tensorParallelFlag(preset, o['tensorParallelSize']),
              reps: intFlag('reps', String(o['reps']), 1, 100),
            });
      if (o['json']) return out(JSON.stringify(tp === null ? r : { ...r, tp }));
      out(
        `model ${r.preset}: ${r.tokensPerSec.toFixed(0)} tokens/s, ${r.gflops.toFixed(2)} GFLOP/s vs roofline ${r.rooflineGflops.toFixed(2)} = ratio ${r.ratio.toFixed(2)}`,
      );
      if (tp !== null)
        out(
          `threaded device: TP=${tp.tensorParallelSize} ${tp.tpTokensPerSec.toFixed(0)} tokens/s vs TP=1 ${tp.tp1TokensPerSec.toFixed(0)} tokens/s = ratio ${tp.speedup.toFixed(2)} ` +
            `(median of ${tp.reps}; ${tp.tensorParallelSize} independent threads give ${tp.threadScaling.toFixed(2)}x one here)`,
        );
    });
}

function registerBenchSched(bench: Command): void {
  bench
    .command('sched')
    .description(
      'schedule() + buildConnectorMeta per step at 64 and 256 running requests, as a fraction of a model step',
    )
    .option('--model <preset>', 'model preset', 'dsv4-mini')
    .option('--json', 'print one JSON object')
    .action((o: Record<string, string | boolean>) => {
      const rows = benchSched({ preset: anyPresetFlag(o['model']), env: new RealEnv() });
      if (o['json']) out(JSON.stringify({ model: o['model'], rows }));
      else
        for (const r of rows)
          out(
            `sched ${r.running} running: ${r.schedMsPerStep.toFixed(3)} ms/step = ${(100 * r.fractionOfModelStep).toFixed(2)}% of the batch's model step ` +
              `(${r.modelStepMs.toFixed(1)} ms), ${(100 * r.fractionOfTokenStep).toFixed(1)}% of one request's decode token (${r.tokenStepMs.toFixed(2)} ms)`,
          );
    });
}
