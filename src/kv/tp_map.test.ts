/**
 * Proves the map between tensor parallel degrees against a per-byte model: build every page as the whole
 * (TP=1) page of its tokens, slice it to the source ranks' pages (rankPageRuns), copy the ranges tpRunRanges
 * gives between rank pages, and compare every destination rank's page with the slice of the whole page it
 * should hold: the transferred tokens' bytes exact, every other byte untouched, no byte written twice.
 * fast-check draws the cache (GQA, MLA, compressor, Mamba; preset and synthetic sizes), the degrees (1, 2, 4
 * where they divide), block sizes and paddings on each side, page ids, the token run and the direction
 * (READ: we are the destination; WRITE: the source). Then what it costs (descriptors) and the bug zoo's two
 * wrong maps, which this model catches.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { presetKVGroups } from './presets.ts';
import { rankSpec, realPageBytes, type KVCacheSpec } from './spec.ts';
import { pageFormatOf, tokenRunRanges, type PagedSide } from './token_map.ts';
import { rankPageRuns } from './tp_layout.ts';
import { rankPairRuns, tpRunRanges, type RankRange, type TpMapFaults, type TpSide } from './tp_map.ts';

const SENTINEL = 0xee;

/** Byte b of the whole page of `bs` tokens holding page `page` of the request (a state: one page, page 0). */
function wholePage(spec: KVCacheSpec, bs: number, page: number): Uint8Array {
  const s = { ...spec, blockSize: bs };
  const bytes = new Uint8Array(realPageBytes(s));
  const f = pageFormatOf(s);
  if (f.kind === 'state') return bytes.map((_, b) => (b * 7 + 3) & 0xff);
  let at = 0;
  f.regionTokenBytes.forEach((tb, k) => {
    for (let slot = 0; slot < bs; slot++)
      for (let b = 0; b < tb; b++) bytes[at + slot * tb + b] = ((page * bs + slot) * 31 + k * 101 + b * 7 + 1) & 0xff;
    at += bs * tb;
  });
  return bytes;
}

interface Case {
  spec: KVCacheSpec;
  src: TpSide;
  dst: TpSide;
  start: number;
  end: number;
  read: boolean;
}

/** Each rank's slab (one page per block id) of a side; the source's pages hold their tokens' slices. */
function slabs(c: Case, side: TpSide, fill: boolean): Uint8Array[] {
  const n = Math.max(...side.blockIds, 0) + 1;
  return Array.from({ length: side.tp }, (_, r) => {
    const slab = new Uint8Array(n * side.pageBytes).fill(SENTINEL);
    if (!fill) return slab;
    const runs = rankPageRuns({ ...c.spec, blockSize: side.blockSize }, side.tp, r);
    side.blockIds.forEach((b, i) => {
      const whole = wholePage(c.spec, side.blockSize, side.firstPage + i);
      for (const run of runs)
        slab.set(whole.subarray(run.wholeOffset, run.wholeOffset + run.length), b * side.pageBytes + run.rankOffset);
    });
    return slab;
  });
}

/** Copy the ranges the way the transfer engine would (local/remote as the direction says), counting writes. */
function apply(c: Case, faults: TpMapFaults = {}): { dst: Uint8Array[]; writes: Uint8Array[]; ranges: RankRange[] } {
  const [local, remote] = c.read ? [c.dst, c.src] : [c.src, c.dst];
  const ranges = tpRunRanges(c.spec, local, remote, { start: c.start, end: c.end, localIsDestination: c.read }, faults);
  const src = slabs(c, c.src, true);
  const dst = slabs(c, c.dst, false);
  const writes = dst.map((d) => new Uint8Array(d.length));
  for (const r of ranges) {
    const [dr, dOff, sr, sOff] = c.read
      ? [r.localRank, r.localOffset, r.remoteRank, r.remoteOffset]
      : [r.remoteRank, r.remoteOffset, r.localRank, r.localOffset];
    dst[dr]!.set(src[sr]!.subarray(sOff, sOff + r.length), dOff);
    for (let i = 0; i < r.length; i++) writes[dr]![dOff + i]! += 1;
  }
  return { dst, writes, ranges };
}

/** What each destination rank's slab must hold: the slices of the transferred tokens, SENTINEL elsewhere. */
function expected(c: Case): Uint8Array[] {
  const want = slabs(c, c.dst, true);
  const blank = slabs(c, c.dst, false);
  const f = pageFormatOf(c.spec);
  if (f.kind === 'state') return c.dst.blockIds.length === 0 ? blank : want;
  // Token slots outside [start, end) keep SENTINEL: restore them slot by slot from the blank slab.
  const bs = c.dst.blockSize;
  const rf = pageFormatOf(rankSpec({ ...c.spec, blockSize: bs }, c.dst.tp));
  assert.ok(rf.kind === 'tokens');
  c.dst.blockIds.forEach((b, i) => {
    for (let slot = 0; slot < bs; slot++) {
      const t = (c.dst.firstPage + i) * bs + slot;
      if (t >= c.start && t < c.end) continue;
      let at = b * c.dst.pageBytes;
      for (const tb of rf.regionTokenBytes) {
        for (const r of want.keys()) want[r]!.fill(SENTINEL, at + slot * tb, at + (slot + 1) * tb);
        at += bs * tb;
      }
    }
  });
  return want;
}

const specArb: fc.Arbitrary<KVCacheSpec> = fc.oneof(
  fc.constantFrom(
    ...(['dsv4-mini', 'hybrid-mini', 'llama-mini', 'dsv4-micro', 'hybrid-micro'] as const).flatMap((p) =>
      presetKVGroups(p).map((g) => g.spec),
    ),
  ),
  fc.record({ h: fc.constantFrom(4, 8), d: fc.integer({ min: 1, max: 5 }) }).map(({ h, d }): KVCacheSpec => ({
    type: 'full_attention',
    blockSize: 16,
    numKvHeads: h,
    headSize: d,
    dtype: 'bf16',
    kvQuantMode: 'none',
  })),
  fc.integer({ min: 1, max: 3 }).map((k): KVCacheSpec => ({
    type: 'compressor',
    blockSize: 16,
    stateDim: 4 * k,
    dtype: 'f32',
    kvQuantMode: 'none',
  })),
  fc
    .record({ c: fc.integer({ min: 1, max: 3 }), w: fc.integer({ min: 1, max: 4 }), s: fc.integer({ min: 1, max: 3 }) })
    .map(({ c, w, s }): KVCacheSpec => ({
      type: 'mamba',
      blockSize: 16,
      convDim: 4 * c,
      convWidth: w,
      ssmStateDim: s,
      dtype: 'f32',
    })),
);

/** Degrees that divide the spec's split dimension (KV heads, compressor values, channels; MLA: any). */
function degrees(spec: KVCacheSpec): number[] {
  return [1, 2, 4].filter((t) => splitDim(spec) % t === 0);
}

function splitDim(spec: KVCacheSpec): number {
  if (spec.type === 'full_attention') return spec.numKvHeads;
  if (spec.type === 'compressor') return spec.stateDim;
  return spec.type === 'mamba' ? spec.convDim : 4;
}

const pow2 = fc.constantFrom(1, 2, 8, 16, 32);

const caseArb: fc.Arbitrary<Case> = specArb.chain((spec) =>
  fc
    .record({
      srcTp: fc.constantFrom(...degrees(spec)),
      dstTp: fc.constantFrom(...degrees(spec)),
      sbs: pow2,
      dbs: pow2,
      spad: fc.nat(6),
      dpad: fc.nat(6),
      start: fc.nat(70),
      len: fc.nat(70),
      read: fc.boolean(),
      seed: fc.nat(),
    })
    .map((c): Case => {
      const state = spec.type === 'mamba';
      const [start, end] = state ? [0, 0] : [c.start, c.start + c.len];
      const side = (tp: number, bs: number, pad: number, salt: number): TpSide => {
        const firstPage = state ? 0 : Math.floor(start / bs);
        const n = state ? c.seed % 2 : Math.ceil(end / bs) - firstPage;
        const key = (i: number): number => Math.imul(i + salt, 2654435761) ^ c.seed;
        const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => key(a) - key(b));
        const pageBytes = realPageBytes(rankSpec({ ...spec, blockSize: bs }, tp)) + 4 * pad;
        return { tp, blockSize: bs, pageBytes, blockIds: order.map((i) => 1 + 2 * i), firstPage };
      };
      return {
        spec,
        src: side(c.srcTp, c.sbs, c.spad, 1),
        dst: side(c.dstTp, c.dbs, c.dpad, 5),
        start,
        end,
        read: c.read,
      };
    }),
);

test('property: every destination rank holds exactly the slices of the transferred tokens, each byte written once', () => {
  fc.assert(
    fc.property(caseArb, (c) => {
      const { dst, writes } = apply(c);
      const want = expected(c);
      dst.forEach((slab, r) => {
        assert.deepEqual(slab, want[r], `destination rank ${r} of ${c.dst.tp} (source TP ${c.src.tp})`);
        assert.ok(
          writes[r]!.every((w) => w <= 1),
          'no destination byte is written twice',
        );
      });
    }),
    { numRuns: 500 },
  );
});

test('equal degrees: the same ranges as the token map alone, on rank r <-> rank r (one descriptor per contiguous run)', () => {
  for (const spec of presetKVGroups('hybrid-mini').map((g) => g.spec))
    for (const tp of [1, 2]) {
      const ranked = rankSpec(spec, tp);
      const pageBytes = realPageBytes(ranked);
      const state = spec.type === 'mamba';
      const local: TpSide = { tp, blockSize: 16, pageBytes, blockIds: state ? [3] : [3, 4, 5], firstPage: 0 };
      const remote: TpSide = { tp, blockSize: 16, pageBytes, blockIds: state ? [8] : [7, 8, 9], firstPage: 0 };
      const got = tpRunRanges(spec, local, remote, { start: 0, end: 40, localIsDestination: true });
      const plain = tokenRunRanges(pageFormatOf(ranked), local, remote, 0, 40);
      for (let r = 0; r < tp; r++)
        assert.deepEqual(
          got.filter((x) => x.localRank === r).map(({ localRank: _l, remoteRank, ...x }) => ({ ...x, remoteRank })),
          plain.map((x) => ({ ...x, remoteRank: r })),
        );
      assert.equal(got.length, tp * plain.length);
    }
});

test('P TP=2 -> D TP=1 on GQA: each slot is two runs per region, one from each prefill rank; MLA is read once', () => {
  const [gqa] = presetKVGroups('llama-mini').map((g) => g.spec) as [KVCacheSpec];
  const runs = rankPairRuns(gqa, 2, 1);
  // heads 2 x 16 dims bf16: a slot is 64 B per region, each prefill rank holds 32 of them.
  assert.deepEqual(
    runs.map((r) => [r.srcRank, r.region, r.dstOffset, r.srcOffset, r.length]),
    [
      [0, 0, 0, 0, 32],
      [0, 1, 0, 0, 32],
      [1, 0, 32, 0, 32],
      [1, 1, 32, 0, 32],
    ],
  );
  assert.deepEqual(
    rankPairRuns(gqa, 1, 2).map((r) => [r.dstRank, r.region, r.dstOffset, r.srcOffset, r.length]),
    [
      [0, 0, 0, 0, 32],
      [0, 1, 0, 0, 32],
      [1, 0, 0, 32, 32],
      [1, 1, 0, 32, 32],
    ],
  );
  const [mla] = presetKVGroups('dsv4-mini').map((g) => g.spec) as [KVCacheSpec];
  assert.deepEqual(
    rankPairRuns(mla, 2, 1).map((r) => [r.dstRank, r.srcRank]),
    [[0, 0]],
    'one decode rank reads the replicated latent from prefill rank 0 only',
  );
  assert.deepEqual(
    rankPairRuns(mla, 1, 2).map((r) => [r.dstRank, r.srcRank]),
    [
      [0, 0],
      [1, 0],
    ],
  );
  // Strided: 16 tokens of one page, P TP=2 -> D TP=1: per prefill rank one range per slot and region.
  const page = (tp: number, ids: number[]): TpSide => ({
    tp,
    blockSize: 16,
    pageBytes: realPageBytes(rankSpec(gqa, tp)),
    blockIds: ids,
    firstPage: 0,
  });
  const got = tpRunRanges(gqa, page(1, [2]), page(2, [5]), { start: 0, end: 16, localIsDestination: true });
  assert.equal(got.filter((r) => r.remoteRank === 0).length, 32);
  assert.equal(got.filter((r) => r.remoteRank === 1).length, 32);
});

test('the bug zoo: a head-major reading and a slice off by one rank are wrong where degrees differ, right where equal', () => {
  const spec = presetKVGroups('llama-micro').map((g) => g.spec)[0] as KVCacheSpec;
  const side = (tp: number, bs: number): TpSide => ({
    tp,
    blockSize: bs,
    pageBytes: realPageBytes(rankSpec({ ...spec, blockSize: bs }, tp)),
    blockIds: [1, 3],
    firstPage: 0,
  });
  for (const faults of [{ headMajor: true }, { sliceShift: 1 }] as TpMapFaults[])
    for (const [p, d] of [
      [2, 1],
      [1, 2],
    ]) {
      const c: Case = { spec, src: side(p!, 16), dst: side(d!, 16), start: 0, end: 30, read: true };
      assert.notDeepEqual(apply(c, faults).dst, expected(c), `${JSON.stringify(faults)} at P TP ${p} / D TP ${d}`);
    }
  const same: Case = { spec, src: side(2, 16), dst: side(2, 16), start: 0, end: 30, read: true };
  assert.deepEqual(apply(same, { headMajor: true }).dst, expected(same), 'head-major at equal degrees: whole slots');
});
