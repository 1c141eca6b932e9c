/**
 * `handoff serve --role prefill|decode|both`: one OpenAI-compatible instance. With `--json` it prints
 * one line `{url, role, model, engineId, pid, sideChannelHost, sideChannelPort, dataPort}` once it is
 * listening (`handoff up`, the bench and the tests read it; pass `--port 0` for a free port).
 */
import { Option, type Command } from 'commander';
import { RealEnv } from '../util/env.ts';
import { configureLogs, createLogger } from '../util/log.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance, type InstanceOptions } from '../serve/instance.ts';
import {
  blockSizeFlag,
  choiceFlag,
  hostFlag,
  intFlag,
  LOG_FORMAT_HELP,
  logFormatFlag,
  optionalInt,
  portFlag,
  presetFlag,
  tensorParallelFlag,
} from './flags.ts';
import { onShutdown } from './lifecycle.ts';
import { parsePeerAllowList } from '../connector/peer_directory.ts';

type Opts = Record<string, string | boolean | undefined>;

export function registerServe(program: Command): void {
  program
    .command('serve')
    .description('run one OpenAI-compatible instance: prefill, decode or colocated (both)')
    .option('--role <role>', 'prefill | decode | both', 'both')
    .option('--model <preset>', 'model preset: dsv4-mini | hybrid-mini | llama-mini', 'dsv4-mini')
    .option('--host <host>', 'HTTP interface', '127.0.0.1')
    .option('--port <port>', 'HTTP port (0 = a free one)', '8000')
    .option(
      '--num-blocks <n>',
      'KV pages in the pool (block 0 is the null block)',
      String(DEFAULT_INSTANCE_OPTIONS.numBlocks),
    )
    .option('--block-size <n>', 'tokens per KV page: a power of two up to 256 (prefill and decode may differ)', '16')
    .option(
      '--tensor-parallel-size <n>',
      'ranks (compute threads with their own KV slabs) the model is split over: 1 or 2 (prefill and decode may differ)',
      '1',
    )
    .option('--kv-transfer-config <json>', 'vLLM-style kv_transfer_config; --role sets the default kv_role')
    .option(
      '--transfer-host <host>',
      'interface of the KV side channel and data plane (default: --host, or 127.0.0.1 for a wildcard host)',
    )
    .option('--transfer-port <port>', 'KV side-channel port (0 = a free one)', '0')
    .option('--transfer-data-port <port>', 'KV data-plane port (0 = a free one)', '0')
    .option('--max-num-seqs <n>', 'requests in a batch')
    .option('--max-num-batched-tokens <n>', 'tokens per engine step')
    .option('--max-model-len <n>', 'prompt + output tokens per request')
    .option('--seed <n>', 'model weight seed', '0')
    .option('--race-check', 'run the happens-before race checker on the device')
    .option('--api-key <key>', 'require Authorization: Bearer <key> on /v1/* (or HANDOFF_API_KEY)')
    .option(
      '--side-channel-secret <s>',
      'shared secret for KV side-channel handshakes (or HANDOFF_SIDE_CHANNEL_SECRET)',
    )
    .option(
      '--kv-peers <list>',
      'prefill side channels decode may contact: host:port, host:*, loopback or *, comma separated',
      'loopback',
    )
    .option(
      '--drain-timeout-ms <n>',
      'on SIGTERM: at most this long for in-flight requests and held pages to finish before exiting',
      '30000',
    )
    .option('--json', 'print one JSON line when ready')
    .option('--log-format <format>', LOG_FORMAT_HELP)
    .addOption(new Option('--exit-with-parent', 'exit when stdin closes').hideHelp())
    .action(runServe);
}

async function runServe(o: Opts): Promise<void> {
  configureLogs({ format: logFormatFlag(o['logFormat']) });
  const opts = serveOptionsFrom(o);
  const env = new RealEnv();
  const log = createLogger(`serve-${opts.role}`);
  const drainMs = intFlag('drain-timeout-ms', o['drainTimeoutMs'] ?? '30000', 0, 3_600_000);
  const inst = await startInstance(opts, env, log);
  const managed = o['exitWithParent'] === true;
  // A managed child (of `handoff up`, the bench, the tests) shuts down quietly: its parent reports it.
  // SIGTERM drains: /health and new requests answer 503 while in-flight requests and transfers finish.
  const stop = async (): Promise<void> => {
    const drained = await inst.drainAndClose(drainMs);
    if (!drained) log.warn({ drainMs }, 'drain timed out: closing with work in flight');
  };
  onShutdown(stop, {
    env,
    exitWithParent: managed,
    stopTimeoutMs: drainMs + 10_000,
    log: (m) => (managed ? log.debug(m) : log.info(m)),
  });
  printReady(inst, opts, Boolean(o['json']));
}

/** The ready line: one JSON object with `--json`, else a sentence. */
function printReady(inst: Instance, opts: InstanceOptions, json: boolean): void {
  const ready = {
    url: inst.url,
    role: opts.role,
    model: opts.preset,
    engineId: inst.info.engine_id,
    pid: process.pid,
    sideChannelHost: inst.info.side_channel_host,
    sideChannelPort: inst.info.side_channel_port,
    dataPort: inst.info.data_port,
    transferMode: inst.info.transfer_mode,
  };
  if (json) process.stdout.write(`${JSON.stringify(ready)}\n`);
  else {
    const kv = inst.info.engine_id
      ? `, engine ${inst.info.engine_id}, KV side channel ${inst.info.side_channel_host}:${inst.info.side_channel_port} (${inst.info.transfer_mode})`
      : '';
    process.stdout.write(`handoff serve: ${opts.role} ${opts.preset} listening on ${inst.url}${kv}\n`);
  }
}

export function serveOptionsFrom(o: Opts): InstanceOptions {
  const host = hostFlag('host', o['host']);
  const wildcard = host === '0.0.0.0' || host === '::';
  const scheduler: InstanceOptions['scheduler'] = {};
  const seqs = optionalInt('max-num-seqs', o['maxNumSeqs'], 1, 4096);
  const batched = optionalInt('max-num-batched-tokens', o['maxNumBatchedTokens'], 1, 1 << 20);
  const len = optionalInt('max-model-len', o['maxModelLen'], 2, 1 << 16);
  if (seqs !== undefined) scheduler.maxNumSeqs = seqs;
  if (batched !== undefined) scheduler.maxNumBatchedTokens = batched;
  if (len !== undefined) scheduler.maxModelLen = len;
  return {
    ...DEFAULT_INSTANCE_OPTIONS,
    role: choiceFlag('role', o['role'], ['prefill', 'decode', 'both'] as const),
    preset: presetFlag(o['model']),
    host,
    port: portFlag('port', o['port']),
    numBlocks: intFlag('num-blocks', o['numBlocks'], 2, 1 << 20),
    blockSize: blockSizeFlag(o['blockSize']),
    tensorParallelSize: tensorParallelFlag(presetFlag(o['model']), o['tensorParallelSize']),
    kvTransferConfig: typeof o['kvTransferConfig'] === 'string' ? o['kvTransferConfig'] : null,
    transferHost:
      typeof o['transferHost'] === 'string'
        ? hostFlag('transfer-host', o['transferHost'])
        : wildcard
          ? '127.0.0.1'
          : host,
    transferPort: portFlag('transfer-port', o['transferPort']),
    transferDataPort: portFlag('transfer-data-port', o['transferDataPort']),
    modelSeed: intFlag('seed', o['seed'], 0, 2 ** 32 - 1),
    raceCheck: o['raceCheck'] === true,
    scheduler,
    apiKey: secretFlag(o['apiKey'], 'HANDOFF_API_KEY'),
    sideChannelSecret: secretFlag(o['sideChannelSecret'], 'HANDOFF_SIDE_CHANNEL_SECRET'),
    kvPeers: parsePeerAllowList(typeof o['kvPeers'] === 'string' ? o['kvPeers'] : 'loopback'),
  };
}

/** A flag, else the environment variable; empty means unset. */
export function secretFlag(v: unknown, envName: string): string | null {
  const s = typeof v === 'string' ? v : process.env[envName];
  return s === undefined || s === '' ? null : s;
}
