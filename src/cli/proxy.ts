/**
 * `handoff proxy`: the P/D router over running instances. `--json` prints one ready line `{url, pid,
 * mode, policy}` (tests and scripts pass `--port 0`).
 */
import { Option, type Command } from 'commander';
import { RealEnv } from '../util/env.ts';
import { configureLogs, createLogger } from '../util/log.ts';
import { ROUTING_POLICIES } from '../serve/instance_pool.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy, type ProxyOptions } from '../serve/proxy.ts';
import { PROXY_DRAIN_MS } from '../serve/proxy_drain.ts';
import {
  choiceFlag,
  hostFlag,
  intFlag,
  LOG_FORMAT_HELP,
  logFormatFlag,
  numberFlag,
  portFlag,
  urlListFlag,
} from './flags.ts';
import { DEFAULT_KV_ROUTER_OPTIONS, type KvRouterOptions } from '../serve/kv_router.ts';
import { onShutdown } from './lifecycle.ts';
import { secretFlag } from './serve.ts';

type Opts = Record<string, string | boolean | undefined>;

export function registerProxy(program: Command): void {
  program
    .command('proxy')
    .description(
      'route OpenAI requests over prefill and decode instances (READ: prefill then decode; WRITE: both at once)',
    )
    .requiredOption('--prefill <urls>', 'prefill instance URLs, comma separated')
    .requiredOption('--decode <urls>', 'decode instance URLs, comma separated')
    .option('--mode <mode>', 'read | write', 'read')
    .option('--policy <policy>', 'round-robin | least-loaded | kv-aware', 'round-robin')
    .option(
      '--kv-weight <w>',
      'kv-aware: what a full-prompt prefix hit is worth, in requests of load',
      String(DEFAULT_KV_ROUTER_OPTIONS.kvWeight),
    )
    .option(
      '--skip-prefill-tokens <n>',
      'kv-aware: no remote prefill when the chosen decode holds all but at most N prompt tokens (0: never skip)',
      String(DEFAULT_KV_ROUTER_OPTIONS.skipPrefillMaxTokens),
    )
    .option('--host <host>', 'HTTP interface', '127.0.0.1')
    .option('--port <port>', 'HTTP port (0 = a free one)', '8000')
    .option('--api-key <key>', 'require Authorization: Bearer <key> on /v1/* (or HANDOFF_API_KEY); forwarded upstream')
    .option(
      '--health-interval-ms <n>',
      'period of the instance health checks',
      String(DEFAULT_PROXY_OPTIONS.healthIntervalMs),
    )
    .option('--health-timeout-ms <n>', 'bound on one health check', String(DEFAULT_PROXY_OPTIONS.healthTimeoutMs))
    .option('--json', 'print one JSON line when ready')
    .option('--log-format <format>', LOG_FORMAT_HELP)
    .addOption(new Option('--exit-with-parent', 'exit when stdin closes').hideHelp())
    .action(async (o: Opts) => {
      configureLogs({ format: logFormatFlag(o['logFormat']) });
      const opts = proxyOptionsFrom(o);
      const host = hostFlag('host', o['host']);
      const env = new RealEnv();
      const log = createLogger('proxy');
      const proxy = new Proxy(opts, env, log);
      const port = await proxy.listen(portFlag('port', o['port']), host);
      await proxy.start();
      const managed = o['exitWithParent'] === true;
      const stop = async (): Promise<void> => {
        await proxy.drain(PROXY_DRAIN_MS); // the completions under way are answered first (bounded)
        await proxy.close();
      };
      onShutdown(stop, {
        env,
        exitWithParent: managed,
        stopTimeoutMs: PROXY_DRAIN_MS + 5000,
        log: (m) => (managed ? log.debug(m) : log.info(m)),
      });
      const url = `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
      if (o['json'])
        process.stdout.write(`${JSON.stringify({ url, pid: process.pid, mode: opts.mode, policy: opts.policy })}\n`);
      else {
        process.stdout.write(`handoff proxy: ${opts.mode.toUpperCase()} mode, ${opts.policy}, listening on ${url}\n`);
        for (const p of [proxy.prefill, proxy.decode]) {
          for (const m of p.members)
            process.stdout.write(
              `  ${p.side.padEnd(8)} ${m.url}  ${m.healthy ? 'healthy' : `unhealthy (${m.lastError ?? '?'})`}\n`,
            );
        }
      }
    });
}

/** `--kv-weight` and `--skip-prefill-tokens` (defaults when absent). */
export function routerFlags(o: Opts): KvRouterOptions {
  return {
    kvWeight: numberFlag('kv-weight', o['kvWeight'] ?? DEFAULT_KV_ROUTER_OPTIONS.kvWeight, 0, 1_000_000),
    skipPrefillMaxTokens: intFlag(
      'skip-prefill-tokens',
      o['skipPrefillTokens'] ?? DEFAULT_KV_ROUTER_OPTIONS.skipPrefillMaxTokens,
      0,
      1 << 20,
    ),
  };
}

export function proxyOptionsFrom(o: Opts): ProxyOptions {
  return {
    ...DEFAULT_PROXY_OPTIONS,
    prefillUrls: urlListFlag('prefill', o['prefill']),
    decodeUrls: urlListFlag('decode', o['decode']),
    mode: choiceFlag('mode', o['mode'], ['read', 'write'] as const),
    policy: choiceFlag('policy', o['policy'], ROUTING_POLICIES),
    router: routerFlags(o),
    apiKey: secretFlag(o['apiKey'], 'HANDOFF_API_KEY'),
    healthIntervalMs: intFlag('health-interval-ms', o['healthIntervalMs'], 50, 600_000),
    healthTimeoutMs: intFlag('health-timeout-ms', o['healthTimeoutMs'], 10, 60_000),
  };
}
