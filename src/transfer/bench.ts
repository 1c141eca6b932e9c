/**
 * `handoff bench transfer`: move `pages` pages of `pageBytes` (in each of 2 slabs) from a producer to
 * a consumer with one READ, and compare with the limit measured in the same run between the same
 * endpoints:
 *   - inproc: a memcpy (TypedArray.set) of the same page list (contiguous pages merged first, as the
 *     transfer engine merges them) on one thread;
 *   - tcp: plain sockets between the same two NIC threads (tcp/nic_tcp_raw.ts): every configuration in
 *     RAW_CONFIGS is run on this READ's bytes first, and the fastest is the baseline.
 * Then rounds alternate the backend and the baseline (warm-up rounds for at least WARMUP_MS, then
 * `repeats`), so a slow patch of a shared machine hits both; each keeps its median. The backend's
 * received bytes are verified after every run, each baseline's once. Compare ratios, not absolute GB/s.
 */
import { assert } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import { hexId } from '../util/ids.ts';
import { zeroBytes } from '../util/zero_bytes.ts';
import { createTransferEngine } from './factory.ts';
import { coalesceRanges } from './core/ranges.ts';
import { TcpTransferEngine } from './tcp/tcp.ts';
import { InprocTransferEngine } from './inproc/inproc.ts';
import type { RawConfig } from './tcp/nic_tcp_raw.ts';
import type { TransferBackend, TransferEngine, TransferRange } from './core/types.ts';

export interface BenchOptions {
  backend: TransferBackend;
  env: Env;
  pageBytes: number;
  pages: number;
  /** Timed rounds at least (after the warm-up); short READs get more within a time budget. Default 5. */
  repeats?: number;
  /** Every other page, shuffled: nothing merges (benchRanges). Default false: page i -> page i. */
  scatter?: boolean;
}

/** The `bench transfer --json` contract (DESIGN.md §10). */
export interface BenchResult {
  backend: TransferBackend;
  pageBytes: number;
  bytes: number;
  gbps: number;
  baselineGbps: number;
  ratio: number;
}

/** A result with what the sweep prints besides: the layout and which baseline won. */
export interface BenchPoint extends BenchResult {
  pages: number;
  scatter: boolean;
  /** Descriptors after coalescing (what the NIC moves). */
  descriptors: number;
  baseline: string;
  /**
   * inproc: memcpy of the same page list on the engine thread, right after that thread zeroed the
   * destination (its cache holds it): faster than any copy on another thread can be (README).
   */
  hotMemcpyGbps?: number;
  /**
   * inproc: the baseline's memcpy on the serving NIC thread, timed on the engine thread around one message
   * there and one back (no grant, no engine bookkeeping): the most any transport that hands the copy to
   * another thread can move on this machine (README: the hand-off bound).
   */
  roundTripGbps?: number;
}

export const NUM_SLABS = 2;
const CALIBRATION_ROUNDS = 2;
/**
 * Timed rounds get up to ROUNDS_MAX_FACTOR x `repeats` while they stay under this budget. Loopback on the
 * 2-core VM swings ±20% from one 64 MiB READ to the next: with 6 rounds a point's ratio moved 0.78-1.27
 * between back-to-back measurements of one rig, with 20 rounds 0.87-1.11.
 */
const ROUNDS_BUDGET_MS = 1000;
const ROUNDS_MAX_FACTOR = 10;
/**
 * Untimed rounds first, for at least this long (2-30 rounds): a rig's NIC threads are new isolates whose
 * JIT starts cold, and one warm-up round left the first point measured on a rig (an 8 MiB READ of
 * scattered pages: 512 segments of JS per READ) at 0.55-0.66 of raw in sweeps and 0.98 after 60 rounds.
 */
const WARMUP_MS = 150;
const WARMUP_ROUNDS = { min: 2, max: 30 };

interface Baseline {
  label: string;
  /** A run; when it returns a number, that is its time in ms as measured where it ran (another thread). */
  run: () => Promise<number | void> | number | void;
}

/**
 * Raw-socket configurations the tcp baseline tries in every run (the fastest wins). Chosen from a wider
 * search on the dev machine (README, Measurements): 64 KiB-4 MiB writes, 1-4 connections, corked or
 * not, waiting for 'drain' after every write or keeping 8 MiB queued; these four were the best of it.
 */
export const RAW_CONFIGS: readonly RawConfig[] = [
  { conns: 1, writeBytes: 1 << 20, queueBytes: 8 << 20, cork: false },
  { conns: 1, writeBytes: 4 << 20, queueBytes: 0, cork: false },
  { conns: 2, writeBytes: 1 << 20, queueBytes: 8 << 20, cork: false },
  { conns: 4, writeBytes: 1 << 20, queueBytes: 8 << 20, cork: true },
];

export function rawConfigLabel(c: RawConfig): string {
  const w = c.writeBytes >= 1 << 20 ? `${c.writeBytes >> 20} MiB` : `${c.writeBytes >> 10} KiB`;
  const q = c.queueBytes > 0 ? `${c.queueBytes >> 20} MiB queued` : 'drain per write';
  return `raw socket x${c.conns}, ${w} writes, ${q}${c.cork ? ', corked' : ''}`;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] as number;
}

async function timeMs(env: Env, fn: Baseline['run']): Promise<number> {
  const t0 = env.nowMs();
  const own = await fn();
  return Math.max(typeof own === 'number' ? own : env.nowMs() - t0, 1e-3);
}

/**
 * Slab contents: a byte pattern with a prime period (65521) seeded by the slab index, so a page that
 * lands in the wrong place, or shifted inside its page, does not compare equal. Filled by doubling
 * copies: the fill costs a few memcpys, not a callback per word.
 */
function fillPattern(slab: Uint8Array, seed: number): void {
  const period = Math.min(65521, slab.length);
  let x = (seed * 2654435761 + 1) >>> 0;
  for (let i = 0; i < period; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    slab[i] = x >>> 24;
  }
  for (let n = period; n < slab.length; n *= 2) slab.copyWithin(n, 0, Math.min(n, slab.length - n));
}

interface BenchSide {
  engine: TransferEngine;
  slabs: Uint8Array[];
}

/** One side of the bench: an engine over fresh slabs (the producer's filled with the pattern). */
async function benchSide(
  o: { backend: TransferBackend; env: Env; pageBytes: number; numBlocks: number },
  side: string,
  fill: boolean,
): Promise<BenchSide> {
  const layout = { numSlabs: NUM_SLABS, numBlocks: o.numBlocks, pageBytes: o.pageBytes };
  const buffers = Array.from({ length: NUM_SLABS }, () => new SharedArrayBuffer(layout.numBlocks * o.pageBytes));
  const slabs = buffers.map((b) => new Uint8Array(b));
  if (fill) slabs.forEach((s, i) => fillPattern(s, i + 1));
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
  return { engine, slabs };
}

/**
 * The READ's ranges, per slab. Contiguous: remote page i -> local page i (i = 1..pages): the engine merges
 * them into one range per slab. Scattered: remote pages 1, 3, 5, ... -> the same odd pages shuffled: no
 * two pages are neighbours on either side, so nothing merges, on the wire or at the receiver.
 */
function benchRanges(env: Env, pageBytes: number, pages: number, scatter: boolean): TransferRange[] {
  const blocks = Array.from({ length: pages }, (_, i) => (scatter ? 2 * i + 1 : i + 1));
  const ranges: TransferRange[] = [];
  for (let slab = 0; slab < NUM_SLABS; slab++) {
    const local = [...blocks];
    if (scatter) {
      for (let i = local.length - 1; i > 0; i--) {
        const j = env.rng.int(i + 1);
        [local[i], local[j]] = [local[j] as number, local[i] as number];
      }
    }
    blocks.forEach((b, i) =>
      ranges.push({
        slab,
        remoteOffset: b * pageBytes,
        localOffset: (local[i] as number) * pageBytes,
        length: pageBytes,
      }),
    );
  }
  return ranges;
}

/**
 * Not a baseline: inproc's baseline (the serving NIC thread's memcpy, timed there) timed on this thread
 * instead, around its two thread hops. A READ adds to it only what the engines do (grant, ranges,
 * completion): the hand-off bound.
 */
function roundTrip(baseline: Baseline): Baseline {
  return { label: 'memcpy round trip to the serving NIC thread', run: async () => void (await baseline.run()) };
}

/** Two engines of one backend and page size, handshaken, reused for every measurement of a sweep row. */
export class BenchRig {
  private grants = 0;

  private constructor(
    readonly backend: TransferBackend,
    private readonly env: Env,
    readonly pageBytes: number,
    readonly pagesMax: number,
    private readonly P: BenchSide,
    private readonly D: BenchSide,
  ) {}

  /** `scattered`: slabs with room for the scattered layout (every other page), twice the contiguous one's. */
  static async create(
    backend: TransferBackend,
    env: Env,
    pageBytes: number,
    pagesMax: number,
    scattered = true,
  ): Promise<BenchRig> {
    assert(Number.isInteger(pagesMax) && pagesMax > 0, 'pages must be a positive integer');
    assert(Number.isInteger(pageBytes) && pageBytes > 0, 'pageBytes must be a positive integer');
    const o = { backend, env, pageBytes, numBlocks: (scattered ? 2 : 1) * pagesMax + 1 };
    const [P, D] = await Promise.all([benchSide(o, 'P', true), benchSide(o, 'D', false)]);
    await D.engine.handshake(P.engine.address());
    return new BenchRig(backend, env, pageBytes, pagesMax, P, D);
  }

  close(): Promise<void> {
    return Promise.all([this.P.engine.close(), this.D.engine.close()]).then(() => undefined);
  }

  /** One READ of `pages` pages per slab, against the baselines, interleaved over `repeats` rounds. */
  async measure(pages: number, scatter: boolean, repeats = 5): Promise<BenchPoint> {
    assert(Number.isInteger(pages) && pages > 0 && pages <= this.pagesMax, `pages must be 1..${this.pagesMax}`);
    assert(Number.isInteger(repeats) && repeats > 0, 'repeats must be a positive integer');
    const { P, D, env } = this;
    const ranges = benchRanges(env, this.pageBytes, pages, scatter);
    const bytes = ranges.length * this.pageBytes;
    const transferId = `bench-${++this.grants}`;
    const { token } = P.engine.issueGrant({
      transferId,
      peerEngineId: D.engine.engineId,
      blockIds: [...new Set(ranges.map((r) => r.remoteOffset / this.pageBytes))],
      ttlMs: 3_600_000,
    });
    const read = async (): Promise<void> => {
      const h = D.engine.postRead({
        peerEngineId: P.engine.engineId,
        transferId,
        grantToken: token,
        ranges,
        label: { what: 'bench' },
        footprint: [],
      });
      await D.engine.wait([h], 120_000);
    };
    const baseline = await this.pickBaseline(this.baselines(ranges, bytes), ranges, bytes);
    const series = [{ label: this.backend, run: read }, baseline];
    if (this.backend === 'inproc') series.push(this.hotMemcpy(ranges), roundTrip(baseline));
    const ms = await this.rounds(series, ranges, bytes, repeats);
    P.engine.revokeGrant(transferId);
    const gbpsOf = (i: number): number => bytes / (median(ms[i] as number[]) / 1000) / 1e9;
    const [gbps, baselineGbps] = [gbpsOf(0), gbpsOf(1)];
    const hot = ms[2] === undefined ? {} : { hotMemcpyGbps: gbpsOf(2), roundTripGbps: gbpsOf(3) };
    return {
      backend: this.backend,
      pageBytes: this.pageBytes,
      bytes,
      gbps,
      baselineGbps,
      ratio: gbps / baselineGbps,
      pages,
      scatter,
      descriptors: coalesceRanges(ranges).length,
      baseline: baseline.label,
      ...hot,
    };
  }

  /** Timed runs of each series (index 0 the backend), after the warm-up: milliseconds per series. */
  private async rounds(
    series: Baseline[],
    ranges: TransferRange[],
    bytes: number,
    repeats: number,
  ): Promise<number[][]> {
    const env = this.env;
    const ms: number[][] = series.map(() => []);
    // At least `repeats` timed rounds; more (up to ROUNDS_MAX_FACTOR x) while the timed runs stay under
    // ROUNDS_BUDGET_MS: a steadier median on a noisy machine.
    let [spent, warm, warmSpent] = [0, 0, 0];
    const warming = (): boolean => warm < WARMUP_ROUNDS.min || (warm < WARMUP_ROUNDS.max && warmSpent < WARMUP_MS);
    for (
      let round = 0;
      warming() || round - warm < repeats || (round - warm < ROUNDS_MAX_FACTOR * repeats && spent < ROUNDS_BUDGET_MS);
      round++
    ) {
      const timed = !warming();
      for (let k = 0; k < series.length; k++) {
        const i = (k + round) % series.length; // alternate who goes first
        // Every run starts from its destination bytes just zeroed by this thread: the same cache state
        // for the backend and its baseline (the raw stream writes the first `bytes` of the slabs).
        if (i === 0 || this.backend === 'inproc') this.zeroDestinations(ranges);
        else this.zeroRawDestination(bytes);
        const t = await timeMs(env, (series[i] as Baseline).run);
        if (i === 0) this.verify(ranges);
        else if (round === 0) this.verifyBaseline(ranges, bytes);
        if (timed) {
          ms[i]?.push(t);
          spent += t;
        } else warmSpent += t;
      }
      if (!timed) warm++;
    }
    return ms;
  }

  /**
   * The fastest of the candidate baselines on this READ: CALIBRATION_ROUNDS rounds of every candidate,
   * the best run wins. Choosing on separate runs keeps the measured baseline unbiased (the best of noisy
   * medians would be luckier than the configuration is). Each candidate's bytes are verified once.
   */
  private async pickBaseline(candidates: Baseline[], ranges: TransferRange[], bytes: number): Promise<Baseline> {
    if (candidates.length === 1) return candidates[0] as Baseline;
    const best = candidates.map(() => Infinity);
    for (let round = 0; round < CALIBRATION_ROUNDS; round++) {
      for (const [i, c] of candidates.entries()) {
        const t = await timeMs(this.env, c.run);
        if (round === 0) this.verifyBaseline(ranges, bytes);
        best[i] = Math.min(best[i] as number, t);
      }
    }
    return candidates[best.indexOf(Math.min(...best))] as Baseline;
  }

  /** The limits to compare with: memcpy of the same page list (inproc), raw sockets (tcp). */
  private baselines(ranges: TransferRange[], bytes: number): Baseline[] {
    const { P, D } = this;
    if (this.backend === 'inproc') {
      const [from, to] = [P.engine, D.engine];
      assert(from instanceof InprocTransferEngine && to instanceof InprocTransferEngine, 'needs inproc engines');
      const merged = coalesceRanges(ranges);
      return [
        { label: 'memcpy of the same page list, on the serving NIC thread', run: () => to.rawCopyMs(from, merged) },
      ];
    }
    const [from, to] = [P.engine, D.engine];
    assert(from instanceof TcpTransferEngine && to instanceof TcpTransferEngine, 'tcp bench needs tcp engines');
    return RAW_CONFIGS.map((cfg) => ({
      label: rawConfigLabel(cfg),
      run: async () => void (await to.rawStreamMs(from, bytes, cfg)),
    }));
  }

  /** Not a baseline: memcpy on this thread, whose cache holds the destination it just zeroed (BenchPoint). */
  private hotMemcpy(ranges: TransferRange[]): Baseline {
    const merged = coalesceRanges(ranges);
    const run = (): void => {
      for (const r of merged) {
        const src = (this.P.slabs[r.slab] as Uint8Array).subarray(r.remoteOffset, r.remoteOffset + r.length);
        (this.D.slabs[r.slab] as Uint8Array).set(src, r.localOffset);
      }
    };
    return { label: 'memcpy on the engine thread', run };
  }

  /** Zero the pages the READ writes (what verify() checks), nothing more: a whole-slab fill would flush caches. */
  private zeroDestinations(ranges: TransferRange[]): void {
    for (const r of ranges) zeroBytes(this.D.slabs[r.slab] as Uint8Array, r.localOffset, r.localOffset + r.length);
  }

  /** The bytes the raw stream writes: the first `bytes` of the consumer's slabs, in order. */
  private zeroRawDestination(bytes: number): void {
    let left = bytes;
    for (const d of this.D.slabs) {
      const n = Math.min(left, d.length);
      zeroBytes(d, 0, n);
      left -= n;
    }
  }

  private verify(ranges: TransferRange[]): void {
    const { P, D } = this;
    for (const r of ranges) {
      const a = (P.slabs[r.slab] as Uint8Array).subarray(r.remoteOffset, r.remoteOffset + r.length);
      const b = (D.slabs[r.slab] as Uint8Array).subarray(r.localOffset, r.localOffset + r.length);
      assert(Buffer.compare(a, b) === 0, `bench: slab ${r.slab} page at ${r.remoteOffset} arrived corrupted`);
    }
  }

  /** memcpy: the same pages; raw stream: the first `bytes` of the consumer's slabs (in order) are the producer's. */
  private verifyBaseline(ranges: TransferRange[], bytes: number): void {
    if (this.backend !== 'tcp') return this.verify(ranges);
    let left = bytes;
    this.D.slabs.forEach((d, i) => {
      const n = Math.min(left, d.length);
      const p = this.P.slabs[i] as Uint8Array;
      assert(Buffer.compare(p.subarray(0, n), d.subarray(0, n)) === 0, `bench: raw baseline corrupted slab ${i}`);
      left -= n;
    });
  }
}

export async function benchTransferPoint(o: BenchOptions): Promise<BenchPoint> {
  const rig = await BenchRig.create(o.backend, o.env, o.pageBytes, o.pages, o.scatter ?? false);
  try {
    return await rig.measure(o.pages, o.scatter ?? false, o.repeats ?? 5);
  } finally {
    await rig.close();
  }
}

export async function benchTransfer(o: BenchOptions): Promise<BenchResult> {
  const { backend, pageBytes, bytes, gbps, baselineGbps, ratio } = await benchTransferPoint(o);
  return { backend, pageBytes, bytes, gbps, baselineGbps, ratio };
}
