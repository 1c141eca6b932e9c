/**
 * Proves the KV cache manager's allocation rules (hits, external, new, lookahead; Mamba's single page),
 * prefix caching (hit on a second request, eviction on reuse), all-or-nothing allocation, detach and
 * deferred free, and which pages are recorded for zeroing.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { AssertionFailure } from '../util/assert.ts';
import { KVCacheManager, type RequestTokens } from './kv_cache_manager.ts';
import { presetKVGroups, type ModelPreset } from './presets.ts';
import { makeKVCacheConfig } from './spec.ts';

function manager(preset: ModelPreset, numBlocks: number, enableCaching = true): KVCacheManager {
  return new KVCacheManager(makeKVCacheConfig(presetKVGroups(preset), numBlocks), { enableCaching });
}

const prompt = (n: number, base = 100): number[] => Array.from({ length: n }, (_, i) => base + i);
const req = (requestId: string, tokenIds: number[], numComputedTokens?: number): RequestTokens => ({
  requestId,
  tokenIds,
  numComputedTokens,
});

test('attention pages are cdiv(total tokens, 16): prompt, decode growth, lookahead, external tokens', () => {
  const m = manager('llama-mini', 20, false);
  assert.deepEqual(m.allocateSlots(req('a', prompt(40)), 40), [[1, 2, 3]]);
  // 48 computed + 1 new = 49 slots -> a 4th page; then 49 + 1 + lookahead 2 = 52 slots: still 4 pages.
  assert.deepEqual(m.allocateSlots(req('a', prompt(49), 48), 1), [[4]]);
  assert.deepEqual(m.allocateSlots(req('a', prompt(50), 49), 1, { numLookaheadTokens: 2 }), [[]]);
  assert.deepEqual(m.getBlockIds('a'), [[1, 2, 3, 4]]);
  // External tokens: 32 loaded + 1 new + 2 lookahead = 35 slots -> 3 pages.
  assert.deepEqual(m.allocateSlots(req('b', prompt(33)), 1, { numExternalComputedTokens: 32, numLookaheadTokens: 2 }), [
    [5, 6, 7],
  ]);
  assert.equal(m.numRequests(), 2);
  assert.equal(m.getNumFreeBlocks(), 19 - 7);
  m.free('a');
  assert.equal(m.numRequests(), 1);
  assert.equal(m.getNumFreeBlocks(), 19 - 3);
  assert.deepEqual(m.getBlockIds('a'), [[]]);
});

test('a request that holds pages must say how many tokens it has computed', () => {
  const m = manager('llama-mini', 8, false);
  m.allocateSlots(req('a', prompt(10)), 10);
  assert.throws(() => m.allocateSlots(req('a', prompt(11)), 1), /numComputedTokens/);
  assert.throws(() => m.allocateSlots(req('b', prompt(10), 5), 5), AssertionFailure);
});

test('Mamba group: exactly one running state page on the first allocation, never more', () => {
  const m = manager('hybrid-mini', 20, false);
  const first = m.allocateSlots(req('a', prompt(40)), 40);
  assert.equal(first?.[0]?.length, 3);
  assert.equal(first?.[1]?.length, 1);
  assert.deepEqual(m.allocateSlots(req('a', prompt(49), 48), 1), [[5], []]);
  assert.equal(m.getBlockIds('a')[1]?.length, 1);
});

test('out of pages: null, and nothing changed (free count, pages, zeroing list, request count)', () => {
  const m = manager('dsv4-mini', 7); // 6 usable pages
  m.allocateSlots(req('a', prompt(32)), 32); // 2 pages per group
  m.takeNewBlockIds();
  const before = JSON.stringify([
    m.getNumFreeBlocks(),
    m.blockPool.freeBlockIds(),
    m.getBlockIds('a'),
    m.numRequests(),
  ]);
  assert.equal(m.allocateSlots(req('b', prompt(40, 900)), 40), null); // needs 3 + 3 > 2 free
  assert.equal(
    JSON.stringify([m.getNumFreeBlocks(), m.blockPool.freeBlockIds(), m.getBlockIds('a'), m.numRequests()]),
    before,
  );
  assert.deepEqual(m.getBlockIds('b'), [[], []]);
  assert.deepEqual(m.takeNewBlockIds(), []);
});

test('prefix caching: a second request with the same prompt hits the full blocks of every group and touches them', () => {
  const m = manager('dsv4-mini', 20);
  const tokens = prompt(40);
  assert.deepEqual(m.allocateSlots(req('a', tokens), 40), [
    [1, 2, 3],
    [4, 5, 6],
  ]);
  m.takeNewBlockIds();
  const hit = m.getComputedBlocks(req('b', tokens));
  assert.deepEqual(hit, {
    blocks: [
      [1, 2],
      [4, 5],
    ],
    numComputedTokens: 32,
  });
  const added = m.allocateSlots(req('b', tokens), 8, { numNewComputedTokens: 32, newComputedBlocks: hit.blocks });
  assert.deepEqual(
    added,
    [
      [1, 2, 7],
      [4, 5, 8],
    ],
    'hit pages first, then the new page',
  );
  assert.deepEqual(
    [1, 2, 4, 5].map((id) => m.blockPool.block(id).refCnt),
    [2, 2, 2, 2],
  );
  assert.deepEqual(m.takeNewBlockIds(), [7, 8], 'prefix-hit pages are never recorded for zeroing');
  // Freed and cached, a hit on a free block takes it off the free queue.
  m.free('a');
  m.free('b');
  const free = m.getNumFreeBlocks();
  const again = m.getComputedBlocks(req('c', tokens));
  m.allocateSlots(req('c', tokens), 8, { numNewComputedTokens: 32, newComputedBlocks: again.blocks });
  assert.equal(m.getNumFreeBlocks(), free - 4 - 2);
});

test("prefix caching: every group's free hit pages are touched before any group takes fresh pages", () => {
  // Regression (found by the property test): group 1's hit page sat at the free-queue head and was
  // popped as group 0's fresh page before group 1 touched it, so one page was held twice.
  const m = manager('dsv4-mini', 9); // 8 usable
  const tokens = prompt(17);
  assert.deepEqual(m.allocateSlots(req('a', prompt(16)), 16), [[1], [2]]); // both published
  m.free('a'); // queue 3..8, 1, 2
  m.allocateSlots(req('x', prompt(48, 5000)), 48); // [[3,4,5],[6,7,8]]: queue 1, 2
  m.free('x'); // queue 1, 2, 5, 4, 3, 8, 7, 6
  const hit = m.getComputedBlocks(req('b', tokens));
  assert.deepEqual(hit.blocks, [[1], [2]]);
  assert.deepEqual(m.allocateSlots(req('b', tokens), 1, { numNewComputedTokens: 16, newComputedBlocks: hit.blocks }), [
    [1, 5],
    [2, 4],
  ]);
  assert.equal(m.blockPool.block(2).refCnt, 1);
  m.blockPool.verify();
});

test('prefix caching: never the whole prompt, off when disabled, off with a Mamba group', () => {
  const tokens = prompt(32);
  const on = manager('llama-mini', 20);
  on.allocateSlots(req('a', tokens), 32);
  assert.equal(
    on.getComputedBlocks(req('b', tokens)).numComputedTokens,
    16,
    '2 cached blocks, but the last token must be computed',
  );
  assert.equal(on.getComputedBlocks(req('b', prompt(33))).numComputedTokens, 32);
  assert.equal(on.getComputedBlocks(req('b', prompt(40, 7))).numComputedTokens, 0, 'different prompt');
  const off = manager('llama-mini', 20, false);
  off.allocateSlots(req('a', tokens), 32);
  assert.deepEqual(off.getComputedBlocks(req('b', prompt(40))), { blocks: [[]], numComputedTokens: 0 });
  const hybrid = manager('hybrid-mini', 20);
  hybrid.allocateSlots(req('a', tokens), 32);
  assert.deepEqual(hybrid.getComputedBlocks(req('b', prompt(40))), { blocks: [[], []], numComputedTokens: 0 });
});

test('prefix caching: a cached free block is evicted when the pool hands it out again', () => {
  const m = manager('llama-mini', 5); // 4 usable pages
  const tokens = prompt(40);
  m.allocateSlots(req('a', tokens), 40); // pages 1,2,3; 1 and 2 published
  m.free('a'); // queue: 4, 3, 2, 1
  assert.equal(m.getComputedBlocks(req('b', tokens)).numComputedTokens, 32);
  m.allocateSlots(req('x', prompt(48, 5000)), 48); // takes 4, 3, 2: block 2 evicted
  assert.equal(m.blockPool.block(2).blockHash !== null, true, "block 2 now holds x's prefix");
  assert.equal(m.getComputedBlocks(req('b', tokens)).numComputedTokens, 16, 'block 1 still cached, block 2 gone');
  m.allocateSlots(req('y', prompt(16, 7000)), 16); // takes 1: evicted
  assert.equal(m.getComputedBlocks(req('b', tokens)).numComputedTokens, 0);
});

test('a hit that was evicted between getComputedBlocks and allocateSlots is an assertion, not silent corruption', () => {
  const m = manager('llama-mini', 4);
  const tokens = prompt(33);
  m.allocateSlots(req('a', tokens), 33);
  m.free('a');
  const hit = m.getComputedBlocks(req('b', tokens));
  m.allocateSlots(req('x', prompt(48, 5000)), 48); // evicts everything
  assert.throws(
    () => m.allocateSlots(req('b', tokens), 1, { numNewComputedTokens: 32, newComputedBlocks: hit.blocks }),
    /no longer holds/,
  );
});

test('delayCacheBlocks: pages are published only by a later cacheBlocks', () => {
  const m = manager('llama-mini', 20);
  const tokens = prompt(33);
  m.allocateSlots(req('a', tokens), 0, { numExternalComputedTokens: 32, delayCacheBlocks: true });
  assert.equal(m.getComputedBlocks(req('b', tokens)).numComputedTokens, 0);
  m.cacheBlocks(req('a', tokens), 32);
  assert.equal(m.getComputedBlocks(req('b', tokens)).numComputedTokens, 32);
});

test('takeNewBlockIds: dsv4-mini records both attention groups in group order, then drains; a freed page leaves the record', () => {
  const m = manager('dsv4-mini', 20);
  m.allocateSlots(req('a', prompt(20)), 20); // group 0: 1,2  group 1: 3,4
  m.allocateSlots(req('b', prompt(10, 500)), 10); // group 0: 5   group 1: 6
  m.free('b'); // 6, 5 go back before the drain: not b's to zero any more (a zero op on them would be I6)
  assert.deepEqual(m.takeNewBlockIds(), [1, 2, 3, 4]);
  assert.deepEqual(m.takeNewBlockIds(), [], 'drained');
  const mm = manager('dsv4-mini', 4);
  mm.allocateSlots(req('a', prompt(10)), 10); // 1, 2
  mm.free('a');
  mm.allocateSlots(req('b', prompt(10, 500)), 10); // queue was 3, 1, 2: group 0 gets 3, group 1 gets 1
  // a's pages left the record with a; page 1 is recorded again for b's use in group 1 (the other format).
  assert.deepEqual(mm.takeNewBlockIds(), [3, 1]);
});

test('takeNewBlockIds: llama-mini (no zeroing) records nothing; hybrid-mini records the attention group only', () => {
  const llama = manager('llama-mini', 20);
  llama.allocateSlots(req('a', prompt(40)), 40);
  assert.deepEqual(llama.takeNewBlockIds(), []);
  const hybrid = manager('hybrid-mini', 20);
  assert.deepEqual(hybrid.allocateSlots(req('a', prompt(20)), 20), [[1, 2], [3]]);
  assert.deepEqual(hybrid.takeNewBlockIds(), [1, 2]);
  assert.deepEqual(hybrid.getZeroingBlockIdsInRange('a', 0, 20), [1, 2]);
});

test('zeroing ranges: [start/bs, cdiv(end,bs)) of recording groups; re-record from an aligned start only', () => {
  const m = manager('dsv4-mini', 20);
  m.allocateSlots(req('a', prompt(48)), 48); // group 0: 1,2,3  group 1: 4,5,6
  m.takeNewBlockIds();
  assert.deepEqual(m.getZeroingBlockIdsInRange('a', 16, 40), [2, 3, 5, 6]);
  assert.deepEqual(m.getZeroingBlockIdsInRange('a', 32, 32), [], 'empty aligned range');
  assert.deepEqual(m.getZeroingBlockIdsInRange('a', 17, 17), [2, 5], 'vLLM formula: [1, cdiv(17,16)=2)');
  assert.deepEqual(m.getZeroingBlockIdsInRange('a', 0, 1000), [1, 2, 3, 4, 5, 6], 'clipped to the pages held');
  m.recordBlocksForZeroing('a', 32);
  assert.deepEqual(m.takeNewBlockIds(), [3, 6]);
  assert.throws(() => m.recordBlocksForZeroing('a', 20), /not block aligned/);
  const llama = manager('llama-mini', 20);
  llama.allocateSlots(req('a', prompt(48)), 48);
  assert.deepEqual(llama.getZeroingBlockIdsInRange('a', 0, 48), [], 'no recording groups without zeroing');
});

test('re-recording never reaches prefix-hit pages', () => {
  const m = manager('dsv4-mini', 20);
  const tokens = prompt(40);
  m.allocateSlots(req('a', tokens), 40);
  const hit = m.getComputedBlocks(req('b', tokens));
  m.allocateSlots(req('b', tokens), 8, { numNewComputedTokens: 32, newComputedBlocks: hit.blocks });
  assert.throws(() => m.recordBlocksForZeroing('b', 16), /prefix-hit/);
  m.takeNewBlockIds();
  m.recordBlocksForZeroing('b', 32);
  assert.deepEqual(
    m.takeNewBlockIds(),
    m.getBlockIds('b').map((g) => g[2]),
  );
});

test('detach keeps pages held until freeBlockIds, which frees each group in reverse', () => {
  const m = manager('dsv4-mini', 9); // 8 usable
  m.allocateSlots(req('a', prompt(40)), 40); // [1,2,3] [4,5,6]
  const detached = m.detach('a');
  assert.deepEqual(detached, [
    [1, 2, 3],
    [4, 5, 6],
  ]);
  assert.equal(m.numRequests(), 0);
  assert.equal(m.getNumFreeBlocks(), 2, 'still held by the deferred-free fence');
  assert.equal(m.allocateSlots(req('b', prompt(40, 900)), 40), null, 'detached pages are not reusable yet');
  m.freeBlockIds(detached);
  assert.deepEqual(m.blockPool.freeBlockIds(), [7, 8, 3, 2, 1, 6, 5, 4]);
  assert.equal(m.usage(), 0);
  m.blockPool.verify();
});
