/**
 * `handoff bench serve`: load against a running server (--url) or against servers it starts itself
 * (--target pd: prefill + decode + proxy; --target colocated: one `--role both` instance; --target
 * xpyd: --prefill N + --decode M instances behind the proxy, once per --policy, bench_xpyd.ts). Without
 * either it runs pd and colocated, one after the other with the same seeded workload, side by side.
 * `--workload shared-prefix` draws each prompt as one of --prefixes shared prefixes + its own suffix.
 * `--json` prints exactly {requests, ttftMsP50, ttftMsP99, itlMsP50, itlMsP99, tokensPerSec, errors}
 * and so needs one target (--url or --target; with xpyd, one --policy).
 */
import { interruptOnSigint } from './lifecycle.ts';
import type { Command } from 'commander';
import cliProgress from 'cli-progress';
import { RealEnv, type Env } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { createLogger } from '../util/log.ts';
import type { ModelPreset } from '../kv/presets.ts';
import {
  runLoad,
  type BenchServeResult,
  type LoadSpec,
  type RequestOutcome,
  type Workload,
} from '../serve/load_generator.ts';
import { ROUTING_POLICIES } from '../serve/instance_pool.ts';
import { runXpyd } from './bench_xpyd.ts';
import { routerFlags } from './proxy.ts';
import { spawnHandoff } from './children.ts';
import { serveArgs, startLocalCluster } from './cluster.ts';
import { choiceFlag, intFlag, modeFlag, numberFlag, presetFlag, rangeFlag, urlFlag } from './flags.ts';
import { secretFlag } from './serve.ts';
import { checkNumBlocksHoldARequest } from './up.ts';
import { DEFAULT_SCHEDULER_CONFIG } from '../engine/scheduler_config.ts';

type Opts = Record<string, string | boolean | undefined>;
type Target = 'pd' | 'colocated' | 'xpyd';
type Row = { label: string; r: BenchServeResult; extra?: Record<string, string>; kvRead?: KvRead | null };

/** Add `serve` under the `bench` command (created if nobody registered it). */
export function registerBenchServe(program: Command): void {
  const bench =
    program.commands.find((c) => c.name() === 'bench') ?? program.command('bench').description('benchmarks');
  bench
    .command('serve')
    .description(
      'load generator like `vllm bench serve`: TTFT/ITL p50/p99, tokens/s, errors; P/D vs colocated side by side',
    )
    .option('--url <url>', 'a running server or proxy (else servers are started)')
    .option('--target <t>', 'pd | colocated | xpyd: start that deployment (default without --url: pd and colocated)')
    .option('--prefill <n>', 'xpyd: prefill instances', '2')
    .option('--decode <n>', 'xpyd: decode instances', '2')
    .option('--policy <list>', 'xpyd: routing policies to compare, comma separated', 'kv-aware,round-robin')
    .option('--kv-weight <w>', 'xpyd kv-aware: what a full-prompt prefix hit is worth, in requests of load')
    .option('--skip-prefill-tokens <n>', 'xpyd kv-aware: no remote prefill when decode holds all but N tokens')
    .option('--workload <w>', 'random | shared-prefix (default: shared-prefix with xpyd, else random)')
    .option('--prefixes <n>', 'shared-prefix: distinct shared prefixes', '8')
    .option('--prefix-len <n>', 'shared-prefix: tokens per shared prefix', '256')
    .option('--model <preset>', 'model preset of the servers it starts', 'dsv4-mini')
    .option('--mode <mode>', 'read | write (started P/D)', 'read')
    .option('--requests <n>', 'requests to send', '64')
    .option('--concurrency <n>', 'requests in flight at once (default 8 without --rate)')
    .option('--rate <r>', 'Poisson arrivals per second instead of a concurrency')
    .option('--prompt-len <min:max>', 'prompt tokens in [min, max] (default 32:256; shared-prefix: suffix, 16:64)')
    .option('--output-len <min:max>', 'output tokens, uniform in [min, max]', '16:64')
    .option('--seed <n>', 'workload seed', '0')
    .option('--num-blocks <n>', 'KV pages per started instance', '2048')
    .option(
      '--max-model-len <n>',
      'started instances: prompt + output tokens per request (default: the larger of 1024 and the longest prompt + output)',
    )
    .option('--api-key <key>', 'Authorization: Bearer key (or HANDOFF_API_KEY)')
    .option('--json', 'print one JSON object')
    .action(async (o: Opts) => {
      const env = new RealEnv();
      const preset = presetFlag(o['model']);
      const mode = modeFlag(preset, o['mode']);
      const { url, target } = whereFlags(o);
      const spec = loadSpecFrom(o, preset, target);
      const numBlocks = String(intFlag('num-blocks', o['numBlocks'], 2, 1 << 20));
      const maxModelLen = maxModelLenFlag(o, spec);
      const interrupt = interruptOnSigint('interrupted: the summary is of the requests that completed');
      const failed = new AllFailed(interrupt);
      const run = (u: string, label: string, model: string | null): Promise<BenchServeResult> =>
        withProgress(label, spec.requests, (tick) =>
          runLoad({ ...spec, url: u, model }, env, tick, interrupt).then((r) => failed.note(label, r)),
        );
      const done = (rows: Row[]): void => {
        print(o, rows);
        failed.check();
      };
      // A server we did not start may serve another model name: send none (the server's default).
      if (url !== null) return done([{ label: url, r: await run(url, 'bench', null) }]);
      checkNumBlocksHoldARequest(preset, Number(numBlocks), { prefill: undefined, decode: undefined }, +maxModelLen);
      const started = { preset, mode, numBlocks, maxModelLen, apiKey: spec.apiKey };
      if (target === 'xpyd') return done(await xpydRows(o, started, env, (u, l) => run(u, l, preset), interrupt));
      const targets: Target[] = target !== null ? [target] : ['pd', 'colocated'];
      const rows: Row[] = [];
      for (const t of targets) {
        if (rows.length > 0 && interrupt.aborted) break; // Ctrl-C: no next deployment
        rows.push({
          label: t === 'pd' ? `P/D (${mode})` : 'colocated',
          ...(await onStarted(t, started, env, (u) => run(u, t, preset))),
        });
      }
      done(rows);
    });
}

/** Decode's KV READ latency (post → all landed, per request; its /metrics histogram): mean and count. */
async function kvReadStats(decodeUrl: string): Promise<KvRead | null> {
  // catch-ok: a metrics scrape that fails leaves the row out; the load's own result stands
  const text = await fetch(`${decodeUrl}/metrics`).then(
    (r) => (r.ok ? r.text() : ''),
    () => '',
  );
  const value = (name: string): number | null => {
    const m = new RegExp(`^${name}(?:\\{[^}]*\\})? ([0-9.eE+-]+)$`, 'm').exec(text);
    return m ? Number(m[1]) : null;
  };
  const sum = value('handoff_kv_read_seconds_sum');
  const count = value('handoff_kv_read_seconds_count');
  return sum !== null && count !== null && count > 0 ? { meanMs: (sum / count) * 1000, count } : null;
}

interface KvRead {
  meanMs: number;
  count: number;
}

/** The largest --max-model-len `handoff serve` takes. */
const MAX_MODEL_LEN = 1 << 16;

/**
 * Started instances' max_model_len: the flag, or room for the longest prompt (its shared prefix included)
 * + output (at least the default). A workload no instance can take is refused here, before any starts.
 */
function maxModelLenFlag(o: Opts, spec: Pick<LoadSpec, 'promptLen' | 'outputLen' | 'workload'>): string {
  if (o['maxModelLen'] !== undefined) return String(intFlag('max-model-len', o['maxModelLen'], 2, MAX_MODEL_LEN));
  const prefix = spec.workload?.kind === 'shared-prefix' ? spec.workload.prefixLen : 0;
  const longest = prefix + spec.promptLen[1] + spec.outputLen[1];
  if (longest > MAX_MODEL_LEN)
    throw new HandoffError(
      'BAD_CONFIG',
      `--prefix-len + --prompt-len + --output-len: the longest request is ${longest} tokens, over the ${MAX_MODEL_LEN} an instance takes`,
    );
  return String(Math.max(DEFAULT_SCHEDULER_CONFIG.maxModelLen, longest));
}

function loadSpecFrom(o: Opts, preset: ModelPreset, target: Target | null): Omit<LoadSpec, 'url'> {
  if (o['concurrency'] !== undefined && o['rate'] !== undefined)
    throw new HandoffError('BAD_CONFIG', 'pass --concurrency or --rate, not both');
  const kind = choiceFlag('workload', o['workload'] ?? (target === 'xpyd' ? 'shared-prefix' : 'random'), [
    'random',
    'shared-prefix',
  ] as const);
  const workload: Workload =
    kind === 'random'
      ? { kind }
      : {
          kind,
          prefixes: intFlag('prefixes', o['prefixes'], 1, 4096),
          prefixLen: intFlag('prefix-len', o['prefixLen'], 1, 1 << 16),
        };
  return {
    model: preset,
    requests: intFlag('requests', o['requests'], 1, 100_000),
    concurrency: o['rate'] !== undefined ? null : intFlag('concurrency', o['concurrency'] ?? '8', 1, 4096),
    ratePerSec: o['rate'] !== undefined ? numberFlag('rate', o['rate'], 0.001, 100_000) : null,
    promptLen: rangeFlag('prompt-len', o['promptLen'] ?? (kind === 'random' ? '32:256' : '16:64'), 1, 1 << 16),
    outputLen: rangeFlag('output-len', o['outputLen'], 1, 1 << 16),
    seed: intFlag('seed', o['seed'], 0, 2 ** 32 - 1),
    apiKey: secretFlag(o['apiKey'], 'HANDOFF_API_KEY'),
    timeoutMs: 600_000,
    workload,
  };
}

/** --target xpyd: one fresh N+M deployment per policy, rows with hit rate and decode-only routes. */
async function xpydRows(
  o: Opts,
  s: { preset: ModelPreset; mode: 'read' | 'write'; numBlocks: string; maxModelLen: string; apiKey: string | null },
  env: Env,
  run: (url: string, label: string) => Promise<BenchServeResult>,
  stop: AbortSignal,
): Promise<Row[]> {
  const policies = String(o['policy'])
    .split(',')
    .map((p) => choiceFlag('policy', p.trim(), ROUTING_POLICIES));
  if (o['json'] && policies.length !== 1)
    throw new HandoffError('BAD_CONFIG', '--json prints one result: pass one --policy with --target xpyd');
  const numPrefill = intFlag('prefill', o['prefill'], 1, 16);
  const numDecode = intFlag('decode', o['decode'], 1, 16);
  const rows = await runXpyd({ ...s, numPrefill, numDecode, policies, router: routerFlags(o) }, env, run, stop);
  return rows.map((x) => ({
    label: `${numPrefill}P${numDecode}D ${x.label}`,
    r: x.r,
    extra: {
      'prefix hit rate': `${(100 * x.prefixHitRate).toFixed(1)}%`,
      'decode-only': String(x.decodeOnly),
    },
  }));
}

async function onStarted<T>(
  t: Target,
  s: { preset: ModelPreset; mode: 'read' | 'write'; numBlocks: string; maxModelLen: string; apiKey: string | null },
  env: Env,
  fn: (url: string) => Promise<T>,
): Promise<{ r: T; kvRead: KvRead | null }> {
  const common = {
    preset: s.preset,
    mode: s.mode,
    host: '127.0.0.1',
    serveArgs: ['--num-blocks', s.numBlocks, '--max-model-len', s.maxModelLen],
    apiKey: s.apiKey,
  };
  const logLevel = process.env['HANDOFF_LOG_LEVEL'] ?? 'warn';
  if (t === 'pd') {
    const cluster = await startLocalCluster(
      { ...common, proxyPort: 0, log: createLogger('bench', logLevel), childLogLevel: logLevel },
      env,
    );
    try {
      const r = await fn(cluster.proxyUrl);
      return { r, kvRead: await kvReadStats(cluster.decode.url) };
    } finally {
      await cluster.stop();
    }
  }
  const server = await spawnHandoff(serveArgs('both', common), env, { env: { HANDOFF_LOG_LEVEL: logLevel } });
  try {
    return { r: await fn(server.url), kvRead: null };
  } finally {
    await server.stop();
  }
}

async function withProgress<T>(
  label: string,
  total: number,
  fn: (tick: (done: number) => void) => Promise<T>,
): Promise<T> {
  const bar = new cliProgress.SingleBar(
    {
      stream: process.stderr,
      noTTYOutput: !process.stderr.isTTY,
      format: `${label.padEnd(10)} [{bar}] {value}/{total} requests`,
    },
    cliProgress.Presets.shades_classic,
  );
  bar.start(total, 0);
  try {
    return await fn((done) => bar.update(done));
  } finally {
    bar.stop();
  }
}

/** --url (a running server) or --target (what to start); neither: P/D and colocated, started. */
function whereFlags(o: Opts): { url: string | null; target: 'pd' | 'colocated' | 'xpyd' | null } {
  const url = o['url'] !== undefined ? urlFlag('url', o['url']) : null;
  const target =
    o['target'] !== undefined ? choiceFlag('target', o['target'], ['pd', 'colocated', 'xpyd'] as const) : null;
  if (url !== null && target !== null) throw new HandoffError('BAD_CONFIG', 'pass --url or --target, not both');
  if (o['json'] && url === null && target === null)
    throw new HandoffError('BAD_CONFIG', '--json prints one result: pass --url or --target');
  return { url, target };
}

/** The runs in which every request failed: the command fails after its summary. */
class AllFailed {
  private readonly runs: string[] = [];
  constructor(private readonly interrupt: AbortSignal) {}

  note(label: string, r: { result: BenchServeResult; outcomes: RequestOutcome[] }): BenchServeResult {
    const { requests, errors } = r.result;
    const first = r.outcomes.find((x) => x !== undefined && !x.ok)?.error ?? 'no answer';
    if (!this.interrupt.aborted && requests > 0 && errors === requests)
      this.runs.push(`${label}: all ${requests} requests failed (the first: ${first})`);
    return r.result;
  }

  /** Like vLLM's benchmark refusing a run whose requests all fail: a summary of nothing is not a result. */
  check(): void {
    if (this.runs.length > 0) throw new HandoffError('PEER_UNAVAILABLE', this.runs.join('; '));
  }
}

function print(o: Opts, rows: Row[]): void {
  const out = (s: string): void => void process.stdout.write(`${s}\n`);
  if (o['json']) {
    const { requests, ttftMsP50, ttftMsP99, itlMsP50, itlMsP99, tokensPerSec, errors } = (
      rows[0] as { r: BenchServeResult }
    ).r;
    out(JSON.stringify({ requests, ttftMsP50, ttftMsP99, itlMsP50, itlMsP99, tokensPerSec, errors }));
    return;
  }
  const fields: Array<[string, (r: BenchServeResult) => string]> = [
    ['requests', (r) => String(r.requests)],
    ['errors', (r) => String(r.errors)],
    ['TTFT p50 (ms)', (r) => r.ttftMsP50.toFixed(1)],
    ['TTFT p99 (ms)', (r) => r.ttftMsP99.toFixed(1)],
    ['ITL p50 (ms)', (r) => r.itlMsP50.toFixed(2)],
    ['ITL p99 (ms)', (r) => r.itlMsP99.toFixed(2)],
    ['output tokens/s', (r) => r.tokensPerSec.toFixed(1)],
  ];
  const w = Math.max(14, ...rows.map((x) => x.label.length + 2));
  out(`${''.padEnd(18)}${rows.map((x) => x.label.padStart(w)).join('')}`);
  for (const [name, f] of fields) out(`${name.padEnd(18)}${rows.map((x) => f(x.r).padStart(w)).join('')}`);
  // Decode's own measure of the KV handoff (P/D only): the part of TTFT the transfer engine owns.
  if (rows.some((x) => x.kvRead))
    out(
      `${'KV READ mean (ms)'.padEnd(18)}${rows.map((x) => (x.kvRead ? x.kvRead.meanMs.toFixed(2) : '-').padStart(w)).join('')}`,
    );
  for (const name of Object.keys(rows[0]?.extra ?? {}))
    out(`${name.padEnd(18)}${rows.map((x) => (x.extra?.[name] ?? '').padStart(w)).join('')}`);
}
