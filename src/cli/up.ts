/**
 * `handoff up` (what `npm start` runs): `--prefill N` prefill and `--decode M` decode instances (1 and 1
 * by default) as separate processes on free loopback ports (tcp transport), the proxy in this process,
 * dsv4-mini in READ mode by default. Waits until everything is healthy, prints the URL and a ready curl
 * line, and on Ctrl-C / SIGTERM closes the proxy, stops the children (each drains) and exits 0. A child
 * that dies is reported; the proxy routes around it while its role has another live instance, and when
 * a role has none left everything is stopped and the exit code is 1.
 */
import type { Command } from 'commander';
import { RealEnv } from '../util/env.ts';
import { configureLogs, createLogger, currentLogFormat, type LogFormat } from '../util/log.ts';
import {
  blockSizeFlag,
  choiceFlag,
  hostFlag,
  intFlag,
  LOG_FORMAT_HELP,
  logFormatFlag,
  modeFlag,
  optionalInt,
  pdTensorParallelFlags,
  portFlag,
  presetFlag,
} from './flags.ts';
import { checkPortFree, startLocalCluster, type LocalCluster } from './cluster.ts';
import { ROUTING_POLICIES } from '../serve/instance_pool.ts';
import { PROXY_DRAIN_MS } from '../serve/proxy_drain.ts';
import { routerFlags } from './proxy.ts';
import { onShutdown } from './lifecycle.ts';
import { secretFlag } from './serve.ts';
import { DEFAULT_INSTANCE_OPTIONS, pagesForOneRequest } from '../serve/instance.ts';
import { DEFAULT_SCHEDULER_CONFIG } from '../engine/scheduler_config.ts';
import type { ModelPreset } from '../kv/presets.ts';
import { HandoffError } from '../util/errors.ts';

type Opts = Record<string, string | boolean | undefined>;

/**
 * Status lines on stdout, whose reader may be gone (`handoff up | tee up.log` and Ctrl-C: tee dies with the
 * process group): a lost status line is no reason to crash with an EPIPE stack before the proxy drained.
 */
function statusLines(): (s: string) => void {
  process.stdout.on('error', () => {});
  return (s) => void process.stdout.write(`${s}\n`);
}

/**
 * READ mode: decode loads asynchronously unless `--sync-read` (`--async-read` names the default). Either flag
 * is for READ mode only (a WRITE load is asynchronous already), and not both.
 */
function asyncReadFlag(o: Opts, mode: 'read' | 'write'): boolean {
  const asked = o['asyncRead'] === true;
  const sync = o['syncRead'] === true;
  if (asked && sync) throw new HandoffError('BAD_CONFIG', '--async-read and --sync-read contradict each other');
  if ((asked || sync) && mode !== 'read')
    throw new HandoffError('BAD_CONFIG', `--${sync ? 'sync' : 'async'}-read is for READ mode (--mode read)`);
  return mode === 'read' && !sync;
}

/** "READ mode, async loads" / "READ mode, synchronous loads" / "WRITE mode". */
function modeNoteOf(mode: 'read' | 'write', asyncRead: boolean): string {
  const loads = mode === 'read' ? (asyncRead ? ', async loads' : ', synchronous loads') : '';
  return `${mode.toUpperCase()} mode${loads}`;
}

/** Each role's serve flags with its tensor parallel degree. */
function withTensorParallel(
  sizes: { prefill: string[]; decode: string[] },
  tp: { prefill: number; decode: number },
): { prefill: string[]; decode: string[] } {
  return {
    prefill: [...sizes.prefill, '--tensor-parallel-size', String(tp.prefill)],
    decode: [...sizes.decode, '--tensor-parallel-size', String(tp.decode)],
  };
}

/** Configure the `up` command main.ts declares (flags and action). */
export function configureUp(up: Command): void {
  up.option('--model <preset>', 'model preset: dsv4-mini | hybrid-mini | llama-mini', 'dsv4-mini')
    .option('--port <port>', 'proxy port', '8000')
    .option('--host <host>', 'interface of the proxy and the instances', '127.0.0.1')
    .option('--mode <mode>', 'read | write', 'read')
    .option('--async-read', 'READ mode: decode loads KV asynchronously, the batch going on meanwhile (the default)')
    .option('--sync-read', 'READ mode: the decode step that admits a request waits for its READ (before session 20)')
    .option('--prefill <n>', 'prefill instances', '1')
    .option('--decode <n>', 'decode instances', '1')
    .option('--policy <policy>', 'round-robin | least-loaded | kv-aware', 'round-robin')
    .option('--kv-weight <w>', 'kv-aware: what a full-prompt prefix hit is worth, in requests of load')
    .option('--skip-prefill-tokens <n>', 'kv-aware: no remote prefill when decode holds all but N prompt tokens')
    .option('--num-blocks <n>', 'KV pages per instance')
    .option('--block-size <n>', 'tokens per KV page on both instances (a power of two up to 256)')
    .option('--prefill-block-size <n>', 'tokens per KV page of prefill (wins over --block-size)')
    .option('--decode-block-size <n>', 'tokens per KV page of decode (wins over --block-size); may differ from prefill')
    .option('--tensor-parallel-size <n>', 'tensor parallel ranks of both instances (1 or 2)')
    .option('--prefill-tp <n>', 'tensor parallel ranks of prefill (may differ from decode)')
    .option('--decode-tp <n>', 'tensor parallel ranks of decode (may differ from prefill)')
    .option('--api-key <key>', 'require Authorization: Bearer <key> (or HANDOFF_API_KEY)')
    .option('--log-format <format>', `${LOG_FORMAT_HELP}; passed on to prefill and decode`)
    .action(async (o: Opts) => {
      configureLogs({ format: logFormatFlag(o['logFormat']) });
      const preset = presetFlag(o['model']);
      const sizes = upRoleServeArgs(o); // a bad size is refused here, before any child starts
      const serveArgs = upServeArgs(o, currentLogFormat()); // so is a bad --num-blocks
      // and one too small for a request of the children's max model length
      const numBlocks = optionalInt('num-blocks', o['numBlocks'], 2, 1 << 20) ?? DEFAULT_INSTANCE_OPTIONS.numBlocks;
      checkNumBlocksHoldARequest(preset, numBlocks, upRoleBlockSizes(o));
      const tp = pdTensorParallelFlags(preset, o);
      const mode = modeFlag(preset, o['mode']);
      const asyncRead = asyncReadFlag(o, mode);
      const port = portFlag('port', o['port']);
      const host = hostFlag('host', o['host']);
      const apiKey = secretFlag(o['apiKey'], 'HANDOFF_API_KEY');
      const numPrefill = intFlag('prefill', o['prefill'], 1, 16);
      const numDecode = intFlag('decode', o['decode'], 1, 16);
      const policy = choiceFlag('policy', o['policy'], ROUTING_POLICIES);
      const router = routerFlags(o);
      const env = new RealEnv();
      const log = createLogger('up');
      const out = statusLines();
      await checkPortFree(host, port); // before any child starts: a busy --port exits 1 at once
      const what = numPrefill + numDecode === 2 ? 'prefill and decode' : `${numPrefill} prefill + ${numDecode} decode`;
      out(`handoff up: starting ${what} (${preset}, ${modeNoteOf(mode, asyncRead)}, tcp transport${tpNoteOf(tp)})...`);
      const roleServeArgs = withTensorParallel(sizes, tp);
      const started = leaveOnSignalDuringStartup(out);
      const cluster = await startLocalCluster(
        {
          preset,
          mode,
          asyncRead,
          host,
          proxyPort: port,
          serveArgs,
          roleServeArgs,
          apiKey,
          log,
          numPrefill,
          numDecode,
          policy,
          router,
        },
        env,
      );
      started();
      superviseChildren(cluster, env, out);
      printReady(cluster, { preset, mode, policy, apiKey }, out);
    });
}

/** The start line's note on tensor parallelism (nothing at TP 1). */
function tpNoteOf(tp: { prefill: number; decode: number }): string {
  if (tp.prefill !== tp.decode) return `, prefill TP=${tp.prefill}, decode TP=${tp.decode}`;
  return tp.prefill > 1 ? `, TP=${tp.prefill} each` : '';
}

/**
 * Ctrl-C / SIGTERM while the children start: leave at once (exit 0); each child sees its stdin end (its
 * parent gone) and shuts down by itself. Call the returned function once superviseChildren can take over.
 */
function leaveOnSignalDuringStartup(out: (s: string) => void): () => void {
  const early = (sig: string): void => {
    out(`handoff up: ${sig} during startup: stopping`);
    process.exit(0);
  };
  process.once('SIGINT', early);
  process.once('SIGTERM', early);
  return () => {
    process.off('SIGINT', early);
    process.off('SIGTERM', early);
  };
}

/** Ctrl-C stops everything (exit 0); a dead child is routed around until its role has none left (exit 1). */
function superviseChildren(cluster: LocalCluster, env: RealEnv, out: (s: string) => void): void {
  let stopping = false;
  const stop = async (): Promise<void> => {
    stopping = true;
    await cluster.proxy.drain(PROXY_DRAIN_MS); // the completions under way are answered first (bounded)
    await cluster.stop();
  };
  onShutdown(stop, { env, exitWithParent: false, stopTimeoutMs: 40_000, log: (m) => out(`handoff up: ${m}`) });
  for (const [role, group] of [
    ['prefill', cluster.prefills],
    ['decode', cluster.decodes],
  ] as const) {
    for (const c of group) {
      const onExit = (code: number | null, signal: string | null): void => {
        if (stopping) return;
        const left = group.filter((x) => !x.exited).length;
        const tail = left > 0 ? `; ${left} ${role} left, routing around it` : '; stopping everything';
        out(`handoff up: ${role} (pid ${c.pid}) exited (code ${code}, signal ${signal})${tail}`);
        if (left === 0) void stop().finally(() => process.exit(1));
      };
      // One already gone fired its exit before we listened.
      if (c.exited) onExit(c.child.exitCode, c.child.signalCode);
      else c.child.once('exit', onExit);
    }
  }
}

/** `s` as one single-quoted shell word: a quote inside it closes, escapes and reopens (`'\\''`). */
export function shellQuote(s: string): string {
  return `'${s.replaceAll("'", "'\\''")}'`;
}

function printReady(
  cluster: LocalCluster,
  o: { preset: string; mode: string; policy: string; apiKey: string | null },
  out: (s: string) => void,
): void {
  // The key as one shell word whatever it holds (a quote in it broke the printed command).
  const auth = o.apiKey ? ` -H ${shellQuote(`Authorization: Bearer ${o.apiKey}`)}` : '';
  for (const [role, group] of [
    ['prefill', cluster.prefills],
    ['decode', cluster.decodes],
  ] as const) {
    for (const c of group) out(`  ${role.padEnd(8)} ${c.url}  (pid ${c.pid}, engine ${String(c.ready['engineId'])})`);
  }
  const policy =
    cluster.prefills.length + cluster.decodes.length > 2 || o.policy !== 'round-robin' ? `, ${o.policy}` : '';
  out(`  proxy    ${cluster.proxyUrl}  (this process, ${o.mode.toUpperCase()} mode${policy})`);
  out('');
  out(`Ready: OpenAI API at ${cluster.proxyUrl}/v1 (model "${o.preset}"). Try:`);
  out(
    `  curl -s ${cluster.proxyUrl}/v1/completions -H 'Content-Type: application/json'${auth} ` +
      `-d '{"model": "${o.preset}", "prompt": "The KV cache moved from prefill to decode and", "max_tokens": 16, "temperature": 0}'`,
  );
  out('Ctrl-C stops everything.');
}

/**
 * Extra `handoff serve` flags for up's children. The log format is always explicit: the children
 * cannot tell how up chose (flag, HANDOFF_LOG_FORMAT or its terminal), so their lines match up's.
 */
export function upServeArgs(o: Opts, logFormat: LogFormat): string[] {
  const numBlocks = optionalInt('num-blocks', o['numBlocks'], 2, 1 << 20);
  return [...(numBlocks !== undefined ? ['--num-blocks', String(numBlocks)] : []), '--log-format', logFormat];
}

/**
 * Each child's `--block-size`: `--block-size` for both, `--prefill-block-size` / `--decode-block-size` for
 * one (they win). Checked here (BAD_CONFIG naming the flag) so a bad size stops `up` before any child starts.
 */
export function upRoleServeArgs(o: Opts): { prefill: string[]; decode: string[] } {
  const sizes = upRoleBlockSizes(o);
  const args = (n: number | undefined): string[] => (n === undefined ? [] : ['--block-size', String(n)]);
  return { prefill: args(sizes.prefill), decode: args(sizes.decode) };
}

/** Each role's block size as up's flags set it; undefined: the children's default. */
function upRoleBlockSizes(o: Opts): { prefill: number | undefined; decode: number | undefined } {
  const both = o['blockSize'] === undefined ? undefined : blockSizeFlag(o['blockSize']);
  const side = (flag: 'prefill-block-size' | 'decode-block-size', key: string): number | undefined =>
    o[key] === undefined ? both : blockSizeFlag(o[key], flag);
  return {
    prefill: side('prefill-block-size', 'prefillBlockSize'),
    decode: side('decode-block-size', 'decodeBlockSize'),
  };
}

/**
 * `--num-blocks` must hold one request of the children's max model length (up and soak set none: serve's
 * default; bench serve's) at each role's block size; every child would refuse it, after all were started.
 * BAD_CONFIG naming the command's own flags.
 */
export function checkNumBlocksHoldARequest(
  preset: ModelPreset,
  numBlocks: number,
  blockSizes: { prefill: number | undefined; decode: number | undefined },
  maxModelLen: number = DEFAULT_SCHEDULER_CONFIG.maxModelLen,
): void {
  for (const role of ['prefill', 'decode'] as const) {
    const blockSize = blockSizes[role] ?? DEFAULT_INSTANCE_OPTIONS.blockSize;
    const need = pagesForOneRequest(preset, maxModelLen, blockSize);
    if (numBlocks < need)
      throw new HandoffError(
        'BAD_CONFIG',
        `--num-blocks ${numBlocks} cannot hold one request of ${maxModelLen} tokens (the instances' max model ` +
          `length) on ${role} at ${blockSize} tokens per page: needs >= ${need}`,
      );
  }
}
