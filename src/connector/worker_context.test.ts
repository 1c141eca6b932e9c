/**
 * Proves the worker side's byte plan of a transfer: coalesced ranges on both sides with each side's page
 * size, a footprint of exactly the bytes moved, one access per page even when a range runs over several
 * of our pages, and the clipped tail of a decode page larger than the prefill pages it receives.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import { mutationsFor } from '../util/mutants.ts';
import type { Device } from '../device/types.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import type { TransferEngine } from '../transfer/core/types.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from './config.ts';
import type { PeerDirectory } from './peer_directory.ts';
import { WorkerContext } from './worker_context.ts';

function context(blockSize: number, preset: 'dsv4-mini' | 'llama-mini' = 'dsv4-mini', tp = 1): WorkerContext {
  const kv = makeKVCacheConfig(presetKVGroups(preset, blockSize), 64, tp);
  const unused = {} as unknown;
  return new WorkerContext(
    DEFAULT_ONE_SIDED_CONFIG,
    kv,
    unused as TransferEngine,
    unused as Device,
    kv.groups.map((g) => g.groupId),
    new SimEnv(1),
    unused as PeerDirectory,
    mutationsFor(undefined),
    undefined,
  );
}

test('equal sizes: contiguous pages on both sides coalesce into one range per slab; the footprint has one access per page', () => {
  const ctx = context(16, 'llama-mini'); // one group, 2 slabs, 16 tokens x 128 B = 2048 B pages
  const plan = { local: [[5, 6]], remote: [[10, 11]], runs: [[0, 32]] as Array<[number, number]> };
  const { ranges, footprint } = ctx.rangesFor(
    plan,
    { pageBytes: 2048, numBlocks: 64, blockSizes: [16], tensorParallelSize: 1, numLayerSlabs: 2 },
    true,
  );
  assert.deepEqual(ranges, [
    { slab: 0, localOffset: 5 * 2048, remoteOffset: 10 * 2048, length: 4096 },
    { slab: 1, localOffset: 5 * 2048, remoteOffset: 10 * 2048, length: 4096 },
  ]);
  assert.deepEqual(
    footprint.map((a) => [a.slab, a.block, a.start, a.end, a.write]),
    [
      [0, 5, 0, 2048, true],
      [0, 6, 0, 2048, true],
      [1, 5, 0, 2048, true],
      [1, 6, 0, 2048, true],
    ],
  );
  assert.deepEqual(ctx.clippedTails(plan), [], 'one precision: nothing to zero');
});

test('decode 32 / prefill 8 tokens per page on dsv4-mini: prefill pages map into slots of one decode page; its tail is named', () => {
  const ctx = context(32); // MLA and compressor: 80 B per token, 2560 B pages
  const plan = {
    local: [[3], [4]],
    remote: [
      [7, 9, 8],
      [17, 19, 18],
    ],
    runs: [
      [0, 20],
      [0, 20],
    ] as Array<[number, number]>,
  };
  const { ranges, footprint } = ctx.rangesFor(
    plan,
    { pageBytes: 640, numBlocks: 64, blockSizes: [8, 8], tensorParallelSize: 1, numLayerSlabs: 2 },
    true,
  );
  // Group 0, slab 0: tokens 0-7 <- page 7, 8-15 <- page 9, 16-19 <- page 8 (contiguous locally, not remotely).
  assert.deepEqual(
    ranges.filter((r) => r.slab === 0 && r.localOffset < 4 * 2560),
    [
      { slab: 0, localOffset: 3 * 2560, remoteOffset: 7 * 640, length: 640 },
      { slab: 0, localOffset: 3 * 2560 + 640, remoteOffset: 9 * 640, length: 640 },
      { slab: 0, localOffset: 3 * 2560 + 1280, remoteOffset: 8 * 640, length: 320 },
    ],
  );
  assert.ok(footprint.every((a) => a.end <= 2560 && a.end > a.start && a.write));
  assert.deepEqual(
    ctx.clippedTails(plan).map((s) => [s.slab, s.block, s.start, s.end]),
    [
      [0, 3, 1600, 2560],
      [1, 3, 1600, 2560],
      [0, 4, 1600, 2560],
      [1, 4, 1600, 2560],
    ],
  );
  assert.deepEqual(
    ctx.clippedTails({
      local: [[3], [4]],
      runs: [
        [0, 32],
        [0, 32],
      ],
    }),
    [],
    'a whole page: no tail',
  );
});

test('decode TP=1 reading from prefill TP=2 (llama-mini): each slot from both prefill ranks, slab r * 2 + layer on theirs', () => {
  const ctx = context(16, 'llama-mini'); // 2 heads x 16 dims bf16: 64 B per slot and region; pages of 2048 B
  const plan = { local: [[5]], remote: [[10]], runs: [[0, 16]] as Array<[number, number]> };
  const peer = { pageBytes: 1024, numBlocks: 64, blockSizes: [16], tensorParallelSize: 2, numLayerSlabs: 2 };
  const { ranges, footprint } = ctx.rangesFor(plan, peer, true);
  // Per layer slab: 16 slots x 2 regions x 2 prefill ranks, 32 B each (one head), none contiguous on both sides.
  assert.equal(ranges.length, 2 * 16 * 2 * 2);
  assert.deepEqual(
    ranges.find((r) => r.slab === 1 && r.localOffset === 5 * 2048 + 64 + 32),
    {
      slab: 1,
      remoteSlab: 3, // prefill rank 1, layer slab 1
      localOffset: 5 * 2048 + 64 + 32, // slot 1, head 1
      remoteOffset: 10 * 1024 + 32, // its slot 1 (32 B per slot on a rank)
      length: 32,
    },
  );
  // The grant names prefill's pages in every slab: the READ touches exactly page 10, on all four prefill slabs.
  const touched = new Set(ranges.map((r) => `${r.remoteSlab ?? r.slab}:${Math.floor(r.remoteOffset / 1024)}`));
  assert.deepEqual([...touched].sort(), ['0:10', '1:10', '2:10', '3:10']);
  const bytes = (slab: number) => ranges.filter((r) => r.slab === slab).reduce((n, r) => n + r.length, 0);
  assert.deepEqual([bytes(0), bytes(1)], [2048, 2048], 'every byte of the decode page, once');
  assert.equal(
    footprint.reduce((n, a) => n + a.end - a.start, 0),
    4096,
  );
});

test('decode TP=2 reading from prefill TP=1 (llama-mini): each decode rank reads its head slice of the one prefill page', () => {
  const ctx = context(16, 'llama-mini', 2);
  const plan = { local: [[5]], remote: [[10]], runs: [[0, 16]] as Array<[number, number]> };
  const peer = { pageBytes: 2048, numBlocks: 64, blockSizes: [16], tensorParallelSize: 1, numLayerSlabs: 2 };
  const { ranges } = ctx.rangesFor(plan, peer, true);
  const rank1 = ranges.filter((r) => r.slab === 2); // our rank 1, layer slab 0
  assert.equal(rank1.length, 32);
  assert.ok(rank1.every((r) => r.remoteSlab === 0 && r.length === 32 && (r.remoteOffset - 10 * 2048) % 64 === 32));
});

test('decode TP=2: the clipped tail of a larger decode page is named on every rank, in its rank page format', () => {
  const ctx = context(32, 'dsv4-mini', 2); // MLA replicated (80 B per token on each rank, the compressor halved)
  const plan = {
    local: [[3], [4]],
    runs: [
      [0, 20],
      [0, 20],
    ] as Array<[number, number]>,
  };
  const tails = ctx.clippedTails(plan);
  assert.deepEqual([...new Set(tails.map((s) => s.slab))].sort(), [0, 1, 2, 3], 'both layer slabs of both ranks');
  // Tokens 20-31 of each page: MLA 80 B per token (whole latent on every rank), compressor 10 f32 = 40 B.
  assert.deepEqual(
    tails.filter((s) => s.slab === 3).map((s) => [s.block, s.start, s.end]),
    [
      [3, 1600, 2560],
      [4, 800, 1280],
    ],
  );
});
