/**
 * P/D between instances of different tensor parallel degrees (issue 14): which bytes of which source
 * rank's page each destination rank's page receives, composed with the token map between two block
 * sizes (token_map.ts). vLLM PRs 18833 / 20189 read a head slice per decode rank the same way.
 *
 * Both sides cut one whole (TP=1) cache (spec.ts wholeSpec), and rankPageRuns (tp_layout.ts) says where
 * each byte of the whole page sits in a rank's page. The map goes through the whole page at the finer
 * degree T = lcm(P, D): fine slice q (1/T of the KV heads, compressor heads or Mamba channels) is held by
 * source rank q / (T/P) and destination rank q / (T/D), and moves between them:
 *
 *   GQA K of one slot   P TP=2 -> D TP=1:   D r0 | h0 h1 |  <-  P r0 | h0 |,  P r1 | h1 |
 *                       P TP=1 -> D TP=2:   D r0 | h0 |  <-  P r0 | h0 h1 | [0, half);   D r1 | h1 | <- [half, end)
 *   MLA (replicated):   every destination rank reads the whole page once, from source rank (d mod P)
 *   Mamba (a state):    each conv row's channel slice, then the slice's SSM rows
 *
 * Pages are token-major (NHD), so a rank's share of a token slot is one run per region (K, V): a chunk of
 * slots is one range where the run covers the whole slot on both sides (equal degrees: as before), else
 * one range per slot (strided); the ranges of a rank pair are coalesced.
 */
import { assert } from '../util/assert.ts';
import { coalesce, type TransferRange } from './layout.ts';
import { rankSpec, type KVCacheSpec } from './spec.ts';
import { pageFormatOf, statePages, tokenChunks, type PagedSide, type TokenChunk } from './token_map.ts';
import { rankPageRuns, type PageRun } from './tp_layout.ts';

/** `length` bytes of a destination rank's page come from a source rank's page. */
export interface RankPairRun {
  dstRank: number;
  srcRank: number;
  /** Token formats: the region (K, V...), offsets inside one slot of it. A state: 0, offsets in the page. */
  region: number;
  dstOffset: number;
  srcOffset: number;
  length: number;
}

/** What a wrong mapper does, for the bug zoo (util/mutants.ts); the correct map has neither. */
export interface TpMapFaults {
  /** Destination fine slice q reads the source's slice q + sliceShift (a neighbour rank's heads). */
  sliceShift?: number;
  /** Offsets as if pages were head-major (HND): a rank's slice of a chunk of slots as one run per region. */
  headMajor?: boolean;
}

function gcd(a: number, b: number): number {
  return b === 0 ? a : gcd(b, a % b);
}

/** The page rankPageRuns cuts: one token slot (blockSize 1) of a token format, the page of a state. */
function unitSpec(whole: KVCacheSpec): KVCacheSpec {
  return whole.type === 'mamba' ? whole : { ...whole, blockSize: 1 };
}

/** Where each region starts in a one-slot page of `spec` (a state: [0]). */
function regionStarts(spec: KVCacheSpec): number[] {
  const f = pageFormatOf(spec);
  if (f.kind === 'state') return [0];
  const starts: number[] = [];
  let at = 0;
  for (const tb of f.regionTokenBytes) {
    starts.push(at);
    at += tb;
  }
  return starts;
}

function regionAt(starts: readonly number[], offset: number): number {
  let k = 0;
  while (k + 1 < starts.length && (starts[k + 1] as number) <= offset) k++;
  return k;
}

/** Where `length` bytes at `wholeOffset` of the whole page sit in a rank's page (they lie in one run). */
function rankOffsetOf(runs: readonly PageRun[], wholeOffset: number, length: number): number {
  const run = runs.find((r) => r.wholeOffset <= wholeOffset && wholeOffset + length <= r.wholeOffset + r.length);
  assert(run !== undefined, () => `whole bytes [${wholeOffset}, +${length}) are in no run of the rank`);
  return run.rankOffset + wholeOffset - run.wholeOffset;
}

/** Runs of one rank pair and region that continue each other on both sides become one. */
function mergeRuns(runs: RankPairRun[]): RankPairRun[] {
  const key = (r: RankPairRun): number[] => [r.dstRank, r.srcRank, r.region, r.dstOffset];
  const sorted = [...runs].sort((a, b) => {
    const [ka, kb] = [key(a), key(b)];
    return ka.reduce((d, x, i) => d || x - (kb[i] as number), 0);
  });
  const out: RankPairRun[] = [];
  for (const r of sorted) {
    const last = out[out.length - 1];
    const continues =
      last !== undefined &&
      last.dstRank === r.dstRank &&
      last.srcRank === r.srcRank &&
      last.region === r.region &&
      last.dstOffset + last.length === r.dstOffset &&
      last.srcOffset + last.length === r.srcOffset;
    if (continues) last.length += r.length;
    else out.push({ ...r });
  }
  return out;
}

/**
 * Every destination rank's bytes of one slot (a token format) or of the state page, and the source rank
 * and offset each comes from: every destination byte exactly once. `whole`: the TP=1 spec of both sides.
 */
export function rankPairRuns(
  whole: KVCacheSpec,
  srcTp: number,
  dstTp: number,
  faults: TpMapFaults = {},
): RankPairRun[] {
  const unit = unitSpec(whole);
  if (whole.type === 'mla') {
    const [run] = rankPageRuns(unit, 1, 0) as [PageRun];
    return Array.from({ length: dstTp }, (_, d) => ({
      dstRank: d,
      srcRank: d % srcTp,
      region: 0,
      dstOffset: 0,
      srcOffset: 0,
      length: run.length,
    }));
  }
  const fine = (srcTp * dstTp) / gcd(srcTp, dstTp);
  const shift = faults.sliceShift ?? 0;
  const [wholeStarts, dstStarts, srcStarts] = [whole, rankSpec(whole, dstTp), rankSpec(whole, srcTp)].map((s) =>
    regionStarts(unitSpec(s)),
  ) as [number[], number[], number[]];
  const out: RankPairRun[] = [];
  for (let q = 0; q < fine; q++) {
    const from = (q + shift) % fine;
    const d = Math.floor((q * dstTp) / fine);
    const s = Math.floor((from * srcTp) / fine);
    const [dstRuns, srcRuns, theirs] = [
      rankPageRuns(unit, dstTp, d),
      rankPageRuns(unit, srcTp, s),
      rankPageRuns(unit, fine, from),
    ];
    rankPageRuns(unit, fine, q).forEach((run, k) => {
      const src = theirs[k];
      assert(src !== undefined && src.length === run.length, 'fine slices have the same runs');
      const region = regionAt(wholeStarts, run.wholeOffset);
      assert(region === regionAt(wholeStarts, src.wholeOffset), 'a shifted slice stays in its region');
      out.push({
        dstRank: d,
        srcRank: s,
        region,
        dstOffset: rankOffsetOf(dstRuns, run.wholeOffset, run.length) - (dstStarts[region] as number),
        srcOffset: rankOffsetOf(srcRuns, src.wholeOffset, src.length) - (srcStarts[region] as number),
        length: run.length,
      });
    });
  }
  return mergeRuns(out);
}

/** One side of a transfer between degrees: its pages (token_map.ts) and its tensor parallel degree. */
export interface TpSide extends PagedSide {
  tp: number;
}

/** A byte range between rank `localRank`'s page on our side and rank `remoteRank`'s on the peer's. */
export interface RankRange extends TransferRange {
  localRank: number;
  remoteRank: number;
}

/** One side's view of a chunk: its pages, its rank format's region sizes, and where the chunk starts. */
interface ChunkSide {
  side: TpSide;
  regionTokenBytes: number[];
  block: number;
  slot: number;
}

function chunkSides(local: ChunkSide, remote: ChunkSide, c: TokenChunk): [ChunkSide, ChunkSide] {
  return [
    { ...local, block: c.localBlock, slot: c.localSlot },
    { ...remote, block: c.remoteBlock, slot: c.remoteSlot },
  ];
}

/** Byte offset in the slab of slot `slot` + i, run offset `offset`, region `k` of a side's page. */
function slotByte(x: ChunkSide, k: number, offset: number, i: number): number {
  const regionStart = x.side.blockSize * x.regionTokenBytes.slice(0, k).reduce((a, b) => a + b, 0);
  return x.block * x.side.pageBytes + regionStart + (x.slot + i) * (x.regionTokenBytes[k] as number) + offset;
}

/** The ranges of one run over `count` slots: one when it covers whole slots on both sides, else one per slot. */
function runRanges(
  l: ChunkSide,
  r: ChunkSide,
  run: { region: number; local: number; remote: number; length: number },
  count: number,
  headMajor: boolean,
): TransferRange[] {
  const k = run.region;
  if (headMajor) {
    // The bug: a rank's slice of the region taken as [slice][slot] (HND): run offset * blockSize + slot * length.
    const at = (x: ChunkSide, off: number): number =>
      slotByte({ ...x, slot: 0 }, k, 0, 0) + off * x.side.blockSize + x.slot * run.length;
    return [{ localOffset: at(l, run.local), remoteOffset: at(r, run.remote), length: count * run.length }];
  }
  const whole = (x: ChunkSide, off: number): boolean => off === 0 && run.length === x.regionTokenBytes[k];
  if (whole(l, run.local) && whole(r, run.remote))
    return [{ localOffset: slotByte(l, k, 0, 0), remoteOffset: slotByte(r, k, 0, 0), length: count * run.length }];
  return Array.from({ length: count }, (_, i) => ({
    localOffset: slotByte(l, k, run.local, i),
    remoteOffset: slotByte(r, k, run.remote, i),
    length: run.length,
  }));
}

/**
 * The byte ranges moving tokens [start, end) of one cache group between `local` and `remote` (token t <->
 * token t; a state group's page whole, by channel), per rank pair, coalesced. `whole`: the group's TP=1
 * spec; `localIsDestination`: a READ (we receive) rather than a WRITE (we send).
 */
export function tpRunRanges(
  whole: KVCacheSpec,
  local: TpSide,
  remote: TpSide,
  span: { start: number; end: number; localIsDestination: boolean },
  faults: TpMapFaults = {},
): RankRange[] {
  const [dst, src] = span.localIsDestination ? [local, remote] : [remote, local];
  const pairs = rankPairRuns(whole, src.tp, dst.tp, faults).map((p) => {
    const [lr, ll, rr, rl] = span.localIsDestination
      ? [p.dstRank, p.dstOffset, p.srcRank, p.srcOffset]
      : [p.srcRank, p.srcOffset, p.dstRank, p.dstOffset];
    return { localRank: lr, remoteRank: rr, region: p.region, local: ll, remote: rl, length: p.length };
  });
  const [lf, rf] = [pageFormatOf(rankSpec(whole, local.tp)), pageFormatOf(rankSpec(whole, remote.tp))];
  const groups = new Map<string, { localRank: number; remoteRank: number; ranges: TransferRange[] }>();
  const put = (p: (typeof pairs)[number], ranges: TransferRange[]): void => {
    const key = `${p.localRank}:${p.remoteRank}`;
    const g = groups.get(key) ?? { localRank: p.localRank, remoteRank: p.remoteRank, ranges: [] };
    groups.set(key, g);
    g.ranges.push(...ranges);
  };
  if (lf.kind === 'state' || rf.kind === 'state') {
    const pages = statePages(lf, local, remote, rf);
    if (pages !== null)
      for (const p of pairs)
        put(p, [
          {
            localOffset: pages[0] * local.pageBytes + p.local,
            remoteOffset: pages[1] * remote.pageBytes + p.remote,
            length: p.length,
          },
        ]);
  } else {
    const l0: ChunkSide = { side: local, regionTokenBytes: lf.regionTokenBytes, block: 0, slot: 0 };
    const r0: ChunkSide = { side: remote, regionTokenBytes: rf.regionTokenBytes, block: 0, slot: 0 };
    for (const c of tokenChunks(lf, local, remote, span.start, span.end, rf)) {
      const [l, r] = chunkSides(l0, r0, c);
      for (const p of pairs) put(p, runRanges(l, r, p, c.count, faults.headMajor === true));
    }
  }
  return [...groups.values()].flatMap((g) =>
    coalesce(g.ranges).map((r) => ({ ...r, localRank: g.localRank, remoteRank: g.remoteRank })),
  );
}
