/**
 * BlockZeroer: exactly the listed pages of every attention slab become zero, on the compute stream
 * behind earlier ops; other pages (including a Mamba state page) keep their bytes; the zeroer exists
 * only when the cache needs zeroing.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createSimDevice } from '../device/sim.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import { BlockZeroer } from './block_zeroer.ts';

function filledDevice(numSlabs: number, numBlocks: number, pageBytes: number) {
  const d = createSimDevice({ numSlabs, numBlocks, pageBytes });
  d.slabs.forEach((s, i) => s.fill(0x40 + i));
  return d;
}

test('zeroes exactly the listed pages in every attention slab, after earlier ops, and nothing else', async () => {
  const cfg = makeKVCacheConfig(presetKVGroups('dsv4-mini'), 8);
  const d = filledDevice(cfg.numSlabs, cfg.numBlocks, cfg.pageBytes);
  const z = new BlockZeroer(d, cfg);
  assert.deepEqual(z.slabs, [0, 1]);
  const sleep = d.compute.enqueue({ op: { kind: 'sleep', ms: 5 }, label: { what: 'previous forward' } });
  const t = z.zeroBlockIds([2, 5], 1);
  assert.ok(t);
  assert.equal(d.slabs[0]?.[2 * cfg.pageBytes], 0x40, 'queued behind the previous op: not yet executed');
  d.runAll();
  await sleep.done;
  await t.done;
  for (const [slab, s] of d.slabs.entries()) {
    for (let b = 0; b < cfg.numBlocks; b++) {
      const page = s.subarray(b * cfg.pageBytes, (b + 1) * cfg.pageBytes);
      const zeroed = b === 2 || b === 5;
      assert.ok(
        page.every((x) => x === (zeroed ? 0 : 0x40 + slab)),
        `slab ${slab} block ${b}`,
      );
    }
  }
  assert.equal(z.pagesZeroed, 2);
  assert.equal(z.zeroBlockIds([], 2), null, 'an empty list enqueues nothing');
  assert.throws(() => z.zeroBlockIds([0], 3), /invalid block id 0/, 'the null block is never in a zero list');
  assert.throws(() => z.zeroBlockIds([8], 3), /invalid block id 8/);
});

test('hybrid-mini: a Mamba state page not in the list keeps its bytes; llama-mini gets no zeroer', () => {
  const cfg = makeKVCacheConfig(presetKVGroups('hybrid-mini'), 6);
  const d = filledDevice(cfg.numSlabs, cfg.numBlocks, cfg.pageBytes);
  const z = new BlockZeroer(d, cfg);
  z.zeroBlockIds([1], 1); // attention page; block 4 holds a Mamba state
  d.runAll();
  assert.ok(
    d.slabs.every((s) => s.subarray(4 * cfg.pageBytes, 5 * cfg.pageBytes).every((x) => x !== 0)),
    'Mamba page untouched',
  );
  assert.ok(d.slabs.every((s) => s.subarray(cfg.pageBytes, 2 * cfg.pageBytes).every((x) => x === 0)));
  const llama = makeKVCacheConfig(presetKVGroups('llama-mini'), 6);
  assert.throws(() => new BlockZeroer(d, llama), /only when the KV cache needs zeroing/);
});

test('TP=2: the listed pages of every rank’s attention slabs are zeroed (one part per rank on its own stream)', async () => {
  const cfg = makeKVCacheConfig(presetKVGroups('dsv4-mini'), 8, 2);
  const d = createSimDevice({
    numSlabs: cfg.numSlabs,
    numBlocks: cfg.numBlocks,
    pageBytes: cfg.pageBytes,
    tensorParallelSize: 2,
  });
  d.slabs.forEach((s, i) => s.fill(0x40 + i));
  const z = new BlockZeroer(d, cfg);
  assert.deepEqual(z.slabs, [0, 1, 2, 3], 'rank 0 slabs 0-1, rank 1 slabs 2-3');
  const t = z.zeroBlockIds([3], 1);
  assert.deepEqual(
    d.readyOps().map((r) => [r.rank, r.stream]),
    [
      [0, 'compute.r0'],
      [1, 'compute.r1'],
    ],
  );
  d.runAll();
  await t?.done;
  for (const s of d.slabs) {
    assert.ok(s.subarray(3 * cfg.pageBytes, 4 * cfg.pageBytes).every((x) => x === 0));
    assert.ok(s.subarray(2 * cfg.pageBytes, 3 * cfg.pageBytes).every((x) => x !== 0));
  }
});
