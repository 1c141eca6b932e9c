/**
 * `handoff bench transfer`: one point (backend, page size, pages) against its baseline measured in the
 * same run, or `--sweep`: page sizes x READ sizes x layouts x both backends, a table, the targets and an
 * SVG plot (written to `--svg PATH`, default ./bench-transfer.svg).
 */
import { writeFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { availableParallelism, loadavg } from 'node:os';
import type { Command } from 'commander';
import { RealEnv } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { intFlag, outputFilesFlag } from './flags.ts';
import { benchTransferPoint } from '../transfer/bench.ts';
import { benchSweep, sweepHeader, sweepRow, targetLines } from '../transfer/bench_sweep.ts';
import { sweepSvg } from '../transfer/bench_svg.ts';
import type { TransferBackend } from '../transfer/core/types.ts';
import { scatterNative, scatterNativeStatus } from '../transfer/tcp/scatter_native.ts';

type Opts = Record<string, string | boolean | undefined>;

const out = (s: string): void => void process.stdout.write(`${s}\n`);

/** How the tcp backend receives a READ here (HANDOFF_NATIVE=off measures the path without the addon). */
export function tcpReceiveLine(): string {
  return scatterNative() !== null
    ? 'tcp receive: readv straight into the pages (native addon)'
    : `tcp receive: one read per segment >= 64 KiB, else a copy (no native addon: ${scatterNativeStatus()})`;
}

function backendFlag(v: unknown): TransferBackend {
  if (v !== 'inproc' && v !== 'tcp')
    throw new HandoffError('BAD_CONFIG', `--backend must be inproc or tcp, got '${String(v)}'`);
  return v;
}

export function registerBenchTransfer(bench: Command): void {
  bench
    .command('transfer')
    .description('move pages through the transfer engine vs memcpy (inproc) or tuned raw sockets (tcp), same run')
    .option('--backend <b>', 'inproc | tcp (--sweep: only this one; default both)', 'inproc')
    .option('--page-bytes <n>', 'page size', String(32 * 1024))
    .option('--pages <n>', 'pages per slab (2 slabs)', '2048')
    .option('--scatter', 'map each remote page to a shuffled local page (nothing coalesces)')
    .option('--repeats <n>', 'timed rounds after a warm-up (default 5, --sweep 3)')
    .option('--sweep', 'page sizes 4 KiB-4 MiB x READ sizes 8/64 MiB x scattered/contiguous: table, targets, SVG')
    .option('--svg <path>', 'where --sweep writes its plot', 'bench-transfer.svg')
    .option('--json', 'print one JSON object (--sweep: {points, targets})')
    .action(async (o: Opts, cmd: Command) => {
      const env = new RealEnv();
      const repeats = o['repeats'] === undefined ? undefined : intFlag('repeats', o['repeats'], 1, 100);
      if (o['sweep']) {
        const explicit = cmd.getOptionValueSource('backend') === 'cli';
        const backends: TransferBackend[] = explicit ? [backendFlag(o['backend'])] : ['tcp', 'inproc'];
        return sweep(o, backends, env, repeats);
      }
      const r = await benchTransferPoint({
        backend: backendFlag(o['backend']),
        env,
        pageBytes: intFlag('page-bytes', o['pageBytes'], 64, 1 << 24),
        pages: intFlag('pages', o['pages'], 1, 1 << 16),
        scatter: o['scatter'] === true,
        ...(repeats !== undefined ? { repeats } : {}),
      });
      const { backend, pageBytes, bytes, gbps, baselineGbps, ratio, hotMemcpyGbps: hot, roundTripGbps: trip } = r;
      const receive = backend === 'tcp' ? { tcpReceive: tcpReceiveLine() } : {};
      const bound = trip === undefined ? {} : { roundTripGbps: trip };
      if (o['json'])
        return out(JSON.stringify({ backend, pageBytes, bytes, gbps, baselineGbps, ratio, ...bound, ...receive }));
      if (backend === 'tcp') out(tcpReceiveLine());
      const also =
        hot === undefined || trip === undefined
          ? ''
          : `; memcpy on the engine thread, cache hot: ${hot.toFixed(2)} GB/s; the baseline's memcpy timed around its round trip from the engine thread (the hand-off bound): ${trip.toFixed(2)} GB/s = ratio ${(trip / baselineGbps).toFixed(2)}`;
      out(
        `transfer ${backend}: ${gbps.toFixed(2)} GB/s vs baseline ${baselineGbps.toFixed(2)} GB/s = ratio ${ratio.toFixed(2)} (${bytes} bytes, ${pageBytes} B pages; baseline: ${r.baseline}${also})`,
      );
    });
}

/** The machine's state, printed with the sweep: on a shared machine the load average says how far to trust it. */
function machineLine(): string {
  const [one] = loadavg();
  return `${availableParallelism()} CPUs, load average ${(one ?? 0).toFixed(1)}`;
}

async function sweep(o: Opts, backends: TransferBackend[], env: RealEnv, repeats: number | undefined): Promise<void> {
  const json = o['json'] === true;
  const svgPath = resolve(String(o['svg']));
  outputFilesFlag('svg', [svgPath]);
  const before = machineLine();
  if (!json) out(`machine: ${before}`);
  if (!json && backends.includes('tcp')) out(tcpReceiveLine());
  if (!json) out(sweepHeader());
  const points = await benchSweep({
    env,
    backends,
    ...(repeats !== undefined ? { repeats } : {}),
    onPoint: (p) => void (json ? undefined : out(sweepRow(p))),
  });
  const targets = targetLines(points);
  writeFileSync(svgPath, sweepSvg(points, 'handoff bench transfer --sweep: GB/s vs page size, baseline dashed'));
  const after = machineLine();
  if (json) return out(JSON.stringify({ points, targets, svg: svgPath, machine: { before, after } }));
  out(`machine after: ${after}`);
  out('');
  for (const t of targets) out(t);
  out(`plot: ${svgPath}`);
}
