/**
 * `handoff bench transfer`: move `pages` pages of `pageBytes` (in each of 2 slabs) from a producer to
 * a consumer with one READ, and compare with a baseline measured in the same run between the same
 * endpoints: inproc against a memcpy (TypedArray.set) of the same ranges, tcp against a raw socket
 * stream between the same two NIC threads (1 MiB writes). Median of `repeats` runs after a warm-up;
 * the received bytes are verified after every run. Compare ratios, not absolute GB/s.
 */
import { assert } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import { hexId } from '../util/ids.ts';
import { createTransferEngine } from './factory.ts';
import { coalesceRanges } from './core/ranges.ts';
import { TcpTransferEngine } from './tcp/tcp.ts';
import type { TransferBackend, TransferEngine, TransferRange } from './core/types.ts';

export interface BenchOptions {
  backend: TransferBackend;
  env: Env;
  pageBytes: number;
  pages: number;
  /** Timed runs (after one warm-up). Default 5. */
  repeats?: number;
  /** Map remote page i to a shuffled local page (no coalescing). Default false: page i -> page i. */
  scatter?: boolean;
}

export interface BenchResult {
  backend: TransferBackend;
  pageBytes: number;
  bytes: number;
  gbps: number;
  baselineGbps: number;
  ratio: number;
}

const NUM_SLABS = 2;
const RAW_CHUNK_BYTES = 1 << 20;

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] as number;
}

/** Median ms of `fn` over `runs` runs after a warm-up; `prepare` and `check` run untimed around each. */
async function timed(
  env: Env,
  runs: number,
  fn: () => Promise<void> | void,
  prepare = (): void => {},
  check = (): void => {},
): Promise<number> {
  const ms: number[] = [];
  for (let i = 0; i <= runs; i++) {
    prepare();
    const t0 = env.nowMs();
    await fn();
    const dt = env.nowMs() - t0;
    check();
    if (i > 0) ms.push(dt);
  }
  return Math.max(median(ms), 1e-3);
}

interface BenchSide {
  engine: TransferEngine;
  slabs: Uint8Array[];
}

/** One side of the bench: an engine over fresh slabs (the producer's filled with a pattern). */
async function benchSide(o: BenchOptions, side: string, fill: boolean): Promise<BenchSide> {
  const layout = { numSlabs: NUM_SLABS, numBlocks: o.pages + 1, pageBytes: o.pageBytes };
  const buffers = Array.from({ length: NUM_SLABS }, () => new SharedArrayBuffer(layout.numBlocks * o.pageBytes));
  if (fill)
    for (const [i, b] of buffers.entries())
      new Uint32Array(b).forEach((_, j, a) => (a[j] = (j * 2654435761 + i) >>> 0));
  const engine = await createTransferEngine({
    backend: o.backend,
    env: o.env,
    engineId: `bench-${side}-${hexId(o.env, 4)}`,
    modelName: 'bench',
    preset: 'bench',
    layout,
    blockSizes: [16],
    slabs: buffers,
  });
  return { engine, slabs: buffers.map((b) => new Uint8Array(b)) };
}

/** Page i of every slab → page i (or a shuffled page with `scatter`) on the reader. */
function benchRanges(o: BenchOptions, blocks: number[]): TransferRange[] {
  const local = [...blocks];
  if (o.scatter) {
    for (let i = local.length - 1; i > 0; i--) {
      const j = o.env.rng.int(i + 1);
      [local[i], local[j]] = [local[j] as number, local[i] as number];
    }
  }
  const ranges: TransferRange[] = [];
  for (let slab = 0; slab < NUM_SLABS; slab++) {
    blocks.forEach((b, i) =>
      ranges.push({
        slab,
        remoteOffset: b * o.pageBytes,
        localOffset: (local[i] as number) * o.pageBytes,
        length: o.pageBytes,
      }),
    );
  }
  return ranges;
}

/** The baseline measured in the same run: memcpy of the same ranges (inproc) or a raw socket stream (tcp). */
async function baselineMs(
  o: BenchOptions,
  P: BenchSide,
  D: BenchSide,
  ranges: TransferRange[],
  bytes: number,
  repeats: number,
): Promise<number> {
  if (o.backend === 'inproc') {
    const merged = coalesceRanges(ranges);
    return timed(o.env, repeats, () => {
      for (const r of merged) {
        const src = (P.slabs[r.slab] as Uint8Array).subarray(r.remoteOffset, r.remoteOffset + r.length);
        (D.slabs[r.slab] as Uint8Array).set(src, r.localOffset);
      }
    });
  }
  assert(D.engine instanceof TcpTransferEngine && P.engine instanceof TcpTransferEngine, 'tcp bench needs tcp engines');
  const [from, to] = [P.engine, D.engine];
  return timed(o.env, repeats, async () => {
    await to.rawStreamMs(from, bytes, RAW_CHUNK_BYTES);
  });
}

export async function benchTransfer(o: BenchOptions): Promise<BenchResult> {
  assert(Number.isInteger(o.pages) && o.pages > 0, 'pages must be a positive integer');
  assert(Number.isInteger(o.pageBytes) && o.pageBytes > 0, 'pageBytes must be a positive integer');
  const repeats = o.repeats ?? 5;
  const [P, D] = await Promise.all([benchSide(o, 'P', true), benchSide(o, 'D', false)]);
  try {
    await D.engine.handshake(P.engine.address());
    const blocks = Array.from({ length: o.pages }, (_, i) => i + 1);
    const ranges = benchRanges(o, blocks);
    const bytes = ranges.length * o.pageBytes;
    const { token } = P.engine.issueGrant({
      transferId: 'bench',
      peerEngineId: D.engine.engineId,
      blockIds: blocks,
      ttlMs: 3_600_000,
    });
    const verify = (): void => {
      for (const r of ranges) {
        const a = (P.slabs[r.slab] as Uint8Array).subarray(r.remoteOffset, r.remoteOffset + r.length);
        const b = (D.slabs[r.slab] as Uint8Array).subarray(r.localOffset, r.localOffset + r.length);
        assert(Buffer.compare(a, b) === 0, `bench: slab ${r.slab} page at ${r.remoteOffset} arrived corrupted`);
      }
    };
    const label = { what: 'bench' };
    const readMs = await timed(
      o.env,
      repeats,
      async () => {
        const h = D.engine.postRead({
          peerEngineId: P.engine.engineId,
          transferId: 'bench',
          grantToken: token,
          ranges,
          label,
          footprint: [],
        });
        await D.engine.wait([h], 120_000);
      },
      () => D.slabs.forEach((s) => s.fill(0)),
      verify,
    );
    const base = await baselineMs(o, P, D, ranges, bytes, repeats);
    const gbps = bytes / (readMs / 1000) / 1e9;
    const baselineGbps = bytes / (base / 1000) / 1e9;
    return { backend: o.backend, pageBytes: o.pageBytes, bytes, gbps, baselineGbps, ratio: gbps / baselineGbps };
  } finally {
    await Promise.all([P.engine.close(), D.engine.close()]);
  }
}
