/**
 * `handoff up` (what `npm start` runs): prefill and decode as separate processes on free loopback
 * ports (tcp transport), the proxy in this process, dsv4-mini in READ mode by default. Waits until
 * everything is healthy, prints the URL and a ready curl line, and on Ctrl-C / SIGTERM closes the
 * proxy, stops both children and exits 0. If a child dies, everything is stopped and the exit code is 1.
 */
import type { Command } from 'commander';
import { RealEnv } from '../util/env.ts';
import { configureLogs, createLogger, currentLogFormat, type LogFormat } from '../util/log.ts';
import {
  blockSizeFlag,
  choiceFlag,
  LOG_FORMAT_HELP,
  logFormatFlag,
  pdTensorParallelFlags,
  portFlag,
  presetFlag,
} from './flags.ts';
import { checkPortFree, startLocalCluster } from './cluster.ts';
import { onShutdown } from './lifecycle.ts';
import { secretFlag } from './serve.ts';

type Opts = Record<string, string | boolean | undefined>;

/** Configure the `up` command main.ts declares (flags and action). */
export function configureUp(up: Command): void {
  up.option('--model <preset>', 'model preset: dsv4-mini | hybrid-mini | llama-mini', 'dsv4-mini')
    .option('--port <port>', 'proxy port', '8000')
    .option('--host <host>', 'interface of the proxy and the instances', '127.0.0.1')
    .option('--mode <mode>', 'read | write', 'read')
    .option('--num-blocks <n>', 'KV pages per instance')
    .option('--block-size <n>', 'tokens per KV page on both instances (a power of two up to 256)')
    .option('--prefill-block-size <n>', 'tokens per KV page of prefill (wins over --block-size)')
    .option('--decode-block-size <n>', 'tokens per KV page of decode (wins over --block-size); may differ from prefill')
    .option('--tensor-parallel-size <n>', 'tensor parallel ranks of both instances (1 or 2)')
    .option('--prefill-tp <n>', "tensor parallel ranks of prefill (must equal decode's for now)")
    .option('--decode-tp <n>', "tensor parallel ranks of decode (must equal prefill's for now)")
    .option('--api-key <key>', 'require Authorization: Bearer <key> (or HANDOFF_API_KEY)')
    .option('--log-format <format>', `${LOG_FORMAT_HELP}; passed on to prefill and decode`)
    .action(async (o: Opts) => {
      configureLogs({ format: logFormatFlag(o['logFormat']) });
      const preset = presetFlag(o['model']);
      const sizes = upRoleServeArgs(o); // a bad size is refused here, before any child starts
      const tp = pdTensorParallelFlags(preset, o);
      const mode = choiceFlag('mode', o['mode'], ['read', 'write'] as const);
      const port = portFlag('port', o['port']);
      const host = String(o['host']);
      const apiKey = secretFlag(o['apiKey'], 'HANDOFF_API_KEY');
      const env = new RealEnv();
      const log = createLogger('up');
      const out = (s: string): void => void process.stdout.write(`${s}\n`);
      await checkPortFree(host, port); // before any child starts: a busy --port exits 1 at once
      const tpNote = tp.prefill > 1 ? `, TP=${tp.prefill} each` : '';
      out(`handoff up: starting prefill and decode (${preset}, ${mode.toUpperCase()} mode, tcp transport${tpNote})...`);
      const serveArgs = upServeArgs(o, currentLogFormat());
      const roleServeArgs = {
        prefill: [...sizes.prefill, '--tensor-parallel-size', String(tp.prefill)],
        decode: [...sizes.decode, '--tensor-parallel-size', String(tp.decode)],
      };
      const cluster = await startLocalCluster(
        { preset, mode, host, proxyPort: port, serveArgs, roleServeArgs, apiKey, log },
        env,
      );
      let stopping = false;
      const stop = async (): Promise<void> => {
        stopping = true;
        await cluster.stop();
      };
      onShutdown(stop, { env, exitWithParent: false, log: (m) => out(`handoff up: ${m}`) });
      for (const c of [cluster.prefill, cluster.decode]) {
        c.child.once('exit', (code, signal) => {
          if (stopping) return;
          out(
            `handoff up: ${String(c.ready['role'])} (pid ${c.pid}) exited (code ${code}, signal ${signal}); stopping everything`,
          );
          void stop().finally(() => process.exit(1));
        });
      }
      const auth = apiKey ? ` -H 'Authorization: Bearer ${apiKey}'` : '';
      out(
        `  prefill  ${cluster.prefill.url}  (pid ${cluster.prefill.pid}, engine ${String(cluster.prefill.ready['engineId'])})`,
      );
      out(
        `  decode   ${cluster.decode.url}  (pid ${cluster.decode.pid}, engine ${String(cluster.decode.ready['engineId'])})`,
      );
      out(`  proxy    ${cluster.proxyUrl}  (this process, ${mode.toUpperCase()} mode)`);
      out('');
      out(`Ready: OpenAI API at ${cluster.proxyUrl}/v1 (model "${preset}"). Try:`);
      out(
        `  curl -s ${cluster.proxyUrl}/v1/completions -H 'Content-Type: application/json'${auth} ` +
          `-d '{"model": "${preset}", "prompt": "The KV cache moved from prefill to decode and", "max_tokens": 16, "temperature": 0}'`,
      );
      out('Ctrl-C stops everything.');
    });
}

/**
 * Extra `handoff serve` flags for up's children. The log format is always explicit: the children
 * cannot tell how up chose (flag, HANDOFF_LOG_FORMAT or its terminal), so their lines match up's.
 */
export function upServeArgs(o: Opts, logFormat: LogFormat): string[] {
  return [...(typeof o['numBlocks'] === 'string' ? ['--num-blocks', o['numBlocks']] : []), '--log-format', logFormat];
}

/**
 * Each child's `--block-size`: `--block-size` for both, `--prefill-block-size` / `--decode-block-size` for
 * one (they win). Checked here (BAD_CONFIG naming the flag) so a bad size stops `up` before any child starts.
 */
export function upRoleServeArgs(o: Opts): { prefill: string[]; decode: string[] } {
  const both = o['blockSize'] === undefined ? undefined : blockSizeFlag(o['blockSize']);
  const side = (flag: 'prefill-block-size' | 'decode-block-size', key: string): string[] => {
    const n = o[key] === undefined ? both : blockSizeFlag(o[key], flag);
    return n === undefined ? [] : ['--block-size', String(n)];
  };
  return {
    prefill: side('prefill-block-size', 'prefillBlockSize'),
    decode: side('decode-block-size', 'decodeBlockSize'),
  };
}
