/**
 * Proves the transfer offsets of the three tensor layouts (expected values worked out by hand in the
 * comments, our own numbers), coalescing on both sides, our slab ranges, and the error paths.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { HandoffError } from '../util/errors.ts';
import {
  coalesce,
  computeBlockTransferOffsets,
  layerTransferGeometry,
  pageOffset,
  pageRange,
  slabTransferRanges,
  type TransferRange,
} from './layout.ts';
import { presetKVGroups } from './presets.ts';
import { makeKVCacheConfig } from './spec.ts';

function isCode(code: string, msg?: RegExp) {
  return (e: unknown) => e instanceof HandoffError && e.code === code && (msg === undefined || msg.test(e.message));
}

test('separated [2, 6, 2, 3, 4] f32: K region then V region, remote V region placed by the remote block count', () => {
  // bs=2, H=3, D=4: a K block is 2*3*4 = 24 elements = 96 bytes. K region = 6 blocks = 144 elements.
  const g = layerTransferGeometry([2, 6, 2, 3, 4], 4, { remoteNumBlocks: 10 });
  assert.equal(g.layout, 'separated');
  assert.equal(g.blockStride, 24);
  assert.equal(g.localKvStride, 144);
  assert.equal(g.remoteKvStride, 240); // 10 remote blocks * 24
  assert.equal(g.blockLen, 96);
  assert.equal(g.slotBytes, 48);
  assert.equal(g.transfersPerBlock, 2);
  assert.equal(g.splitKvRegions, true);
  // local [2,5] <- remote [7,3]
  // K: local 4*2*24=192, 4*5*24=480;        remote 4*7*24=672, 4*3*24=288
  // V: local 4*(144+48)=768, 4*(144+120)=1056; remote 4*(240+168)=1632, 4*(240+72)=1248
  assert.deepEqual(computeBlockTransferOffsets(g, 4, [2, 5], [7, 3]), {
    localOffsets: [192, 480, 768, 1056],
    remoteOffsets: [672, 288, 1632, 1248],
    sizes: [96, 96, 96, 96],
  });
  // local [2,3] <- remote [7,8]: K 192->672 and 288->768 are contiguous on both sides, so are the V pair.
  assert.deepEqual(computeBlockTransferOffsets(g, 4, [2, 3], [7, 8]), {
    localOffsets: [192, 768],
    remoteOffsets: [672, 1632],
    sizes: [192, 192],
  });
  // Passing the remote block count at call time moves the remote V region: 20 blocks -> kv stride 480.
  assert.deepEqual(computeBlockTransferOffsets(g, 4, [2], [7], 20).remoteOffsets, [672, 4 * (480 + 168)]);
});

test('interleaved [5, 2, 4, 1, 8] bf16: K and V of one block are adjacent, so each block is one range', () => {
  // bs=4, H=1, D=8: a K block is 32 elements = 64 bytes; a block (K+V) is 64 elements.
  const g = layerTransferGeometry([5, 2, 4, 1, 8], 2);
  assert.equal(g.layout, 'interleaved');
  assert.equal(g.blockStride, 64);
  assert.equal(g.localKvStride, 32);
  assert.equal(g.remoteKvStride, 32);
  assert.equal(g.blockLen, 64);
  assert.equal(g.splitKvRegions, false);
  // local [3,1] <- remote [0,2]
  // block 3: K 2*3*64=384 <- 0,   V 2*(32+192)=448 <- 2*32=64     -> merged 384 <- 0, 128 bytes
  // block 1: K 2*64=128   <- 256, V 2*(32+64)=192  <- 2*(32+128)=320 -> merged 128 <- 256, 128 bytes
  // sorted by local: 128 first; 128+128=256 != 384, so two ranges.
  assert.deepEqual(computeBlockTransferOffsets(g, 2, [3, 1], [0, 2]), {
    localOffsets: [128, 384],
    remoteOffsets: [256, 0],
    sizes: [128, 128],
  });
});

test('MLA [7, 4, 10] fp8: key only, one range per block, runs merge when contiguous on both sides', () => {
  const g = layerTransferGeometry([7, 4, 10], 1, { remoteNumBlocks: 12 });
  assert.equal(g.layout, 'mla');
  assert.equal(g.blockStride, 40);
  assert.equal(g.blockLen, 40);
  assert.equal(g.localKvStride, null);
  assert.equal(g.transfersPerBlock, 1);
  // local [4,1,2] <- remote [9,5,6]: 160<-360, 40<-200, 80<-240. Sorted: 40,80 merge (200,240 contiguous), 160 alone.
  assert.deepEqual(computeBlockTransferOffsets(g, 1, [4, 1, 2], [9, 5, 6]), {
    localOffsets: [40, 160],
    remoteOffsets: [200, 360],
    sizes: [80, 40],
  });
});

test('the three layouts give different offsets for the same ids', () => {
  const triples = [
    computeBlockTransferOffsets(layerTransferGeometry([2, 8, 4, 2, 2], 2), 2, [1, 3], [2, 4]),
    computeBlockTransferOffsets(layerTransferGeometry([8, 2, 4, 2, 2], 2), 2, [1, 3], [2, 4]),
    computeBlockTransferOffsets(layerTransferGeometry([8, 4, 4], 2), 2, [1, 3], [2, 4]),
  ].map((t) => JSON.stringify(t));
  assert.equal(new Set(triples).size, 3);
});

test('errors: unequal id lists, ids out of range, duplicate destinations, unsupported or ambiguous shapes', () => {
  const g = layerTransferGeometry([7, 4, 10], 1);
  assert.throws(
    () => computeBlockTransferOffsets(g, 1, [1, 2], [3]),
    isCode('BAD_TRANSFER_PARAMS', /must have the same length/),
  );
  assert.throws(() => computeBlockTransferOffsets(g, 1, [7], [1]), isCode('BAD_TRANSFER_PARAMS', /local block id 7/));
  assert.throws(
    () => computeBlockTransferOffsets(g, 1, [1], [-1]),
    isCode('BAD_TRANSFER_PARAMS', /remote block id -1/),
  );
  assert.throws(() => computeBlockTransferOffsets(g, 1, [1, 1], [2, 3]), isCode('BAD_TRANSFER_PARAMS', /distinct/));
  assert.throws(() => layerTransferGeometry([2, 8, 4, 6], 2), isCode('BAD_CONFIG', /Unsupported K\/V cache shape/));
  assert.throws(() => layerTransferGeometry([3, 8, 4, 2, 2], 2), isCode('BAD_CONFIG', /neither/));
  assert.throws(() => layerTransferGeometry([2, 2, 4, 2, 2], 2), isCode('BAD_CONFIG', /ambiguous/));
  assert.equal(layerTransferGeometry([2, 2, 4, 2, 2], 2, { layout: 'interleaved' }).layout, 'interleaved');
  assert.throws(() => layerTransferGeometry([8, 2, 4, 2, 2], 2, { layout: 'mla' }), isCode('BAD_CONFIG', /MLA/));
  assert.throws(() => layerTransferGeometry([8, 0, 4], 1), isCode('BAD_CONFIG'));
});

test('coalesce: sorts by local offset and merges only what is contiguous on both sides', () => {
  const ranges: TransferRange[] = [
    { localOffset: 20, remoteOffset: 120, length: 10 },
    { localOffset: 0, remoteOffset: 100, length: 10 },
    { localOffset: 10, remoteOffset: 110, length: 10 }, // joins 0 and 20: contiguous on both sides
    { localOffset: 30, remoteOffset: 500, length: 10 }, // local contiguous, remote not: stays separate
    { localOffset: 50, remoteOffset: 510, length: 10 }, // remote contiguous, local not: stays separate
  ];
  assert.deepEqual(coalesce(ranges), [
    { localOffset: 0, remoteOffset: 100, length: 30 },
    { localOffset: 30, remoteOffset: 500, length: 10 },
    { localOffset: 50, remoteOffset: 510, length: 10 },
  ]);
});

test('property: coalescing preserves every byte pairing (local byte x still comes from the same remote byte)', () => {
  fc.assert(
    fc.property(
      fc.uniqueArray(fc.integer({ min: 0, max: 40 }), { maxLength: 20 }),
      fc.array(fc.integer({ min: 0, max: 40 }), { minLength: 20, maxLength: 20 }),
      (locals, remotes) => {
        const ranges = locals.map((l, i) => ({
          localOffset: l * 8,
          remoteOffset: (remotes[i] as number) * 8,
          length: 8,
        }));
        const pairing = (rs: TransferRange[]) => {
          const m = new Map<number, number>();
          for (const r of rs) for (let k = 0; k < r.length; k++) m.set(r.localOffset + k, r.remoteOffset + k);
          return [...m.entries()].sort((a, b) => a[0] - b[0]);
        };
        const merged = coalesce(ranges);
        assert.deepEqual(pairing(merged), pairing(ranges));
        for (let i = 1; i < merged.length; i++) {
          const a = merged[i - 1] as TransferRange;
          const b = merged[i] as TransferRange;
          assert.ok(
            a.localOffset + a.length < b.localOffset || a.remoteOffset + a.length !== b.remoteOffset,
            'a mergeable pair was left',
          );
        }
      },
    ),
  );
});

test('our slabs: page offsets, whole-page ranges per slab, coalesced, multiples of pageBytes', () => {
  const config = makeKVCacheConfig(presetKVGroups('dsv4-mini'), 10);
  const P = config.pageBytes; // 1280: MLA 16 * 80 and compressor 16 * 20 * 4 are equal
  assert.equal(P, 1280);
  assert.equal(pageOffset(config, 3), 3 * P);
  assert.deepEqual(pageRange(config, 1, 9), { slab: 1, offset: 9 * P, length: P });
  // local [3,4,7] <- remote [2,3,9]: pages 3,4 <- 2,3 merge; 7 <- 9 alone. Same ranges in slabs 0 and 1.
  const got = slabTransferRanges(config, [0, 1], [7, 3, 4], [9, 2, 3]);
  const perSlab = [
    { localOffset: 3 * P, remoteOffset: 2 * P, length: 2 * P },
    { localOffset: 7 * P, remoteOffset: 9 * P, length: P },
  ];
  assert.deepEqual(got, [...perSlab.map((r) => ({ slab: 0, ...r })), ...perSlab.map((r) => ({ slab: 1, ...r }))]);
  for (const r of got) assert.equal(r.length % P, 0);
  assert.deepEqual(slabTransferRanges(config, [1], [], []), []);
});

test('our slabs: unequal lengths, negative, null-block, out-of-range ids and bad slabs are BAD_TRANSFER_PARAMS', () => {
  const config = makeKVCacheConfig(presetKVGroups('llama-mini'), 10);
  const bad = isCode('BAD_TRANSFER_PARAMS');
  assert.throws(
    () => slabTransferRanges(config, [0], [1, 2], [1]),
    isCode('BAD_TRANSFER_PARAMS', /must have the same length/),
  );
  assert.throws(() => slabTransferRanges(config, [0], [-1], [1]), bad);
  assert.throws(() => slabTransferRanges(config, [0], [0], [1]), bad);
  assert.throws(() => slabTransferRanges(config, [0], [1], [0]), bad);
  assert.throws(() => slabTransferRanges(config, [0], [10], [1]), bad);
  assert.throws(() => slabTransferRanges(config, [0], [1], [12], { remoteNumBlocks: 12 }), bad);
  assert.throws(() => slabTransferRanges(config, [0], [1.5], [1]), bad);
  assert.throws(() => slabTransferRanges(config, [2], [1], [1]), bad);
  assert.throws(() => slabTransferRanges(config, [0, 0], [1], [1]), bad);
  assert.equal(slabTransferRanges(config, [0], [9], [11], { remoteNumBlocks: 12 }).length, 1);
});
