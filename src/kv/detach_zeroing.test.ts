/**
 * A request detached (finished before the step's zeroing list was taken) takes off that list only the
 * pages no other request holds: a page another request took new this step and this one shared through a
 * prefix hit stays on it, still new to its owner. Before, detach filtered by page id and such pages were
 * never zeroed.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { KVCacheManager } from './kv_cache_manager.ts';
import { presetKVGroups } from './presets.ts';
import { makeKVCacheConfig } from './spec.ts';

test('detach of a prefix-hit holder keeps the pages its owner took new this step on the zeroing list', () => {
  const m = new KVCacheManager(makeKVCacheConfig(presetKVGroups('dsv4-mini'), 30), { enableCaching: true });
  const tokens = Array.from({ length: 40 }, (_, i) => 100 + i);
  // Step k: request c is scheduled, takes fresh pages (recorded for zeroing) and publishes its full blocks.
  const cBlocks = m.allocateSlots({ requestId: 'c', tokenIds: tokens }, 40);
  assert.ok(cBlocks !== null);
  // Same step: request a (same prompt) hits c's full blocks and is then finished before the drain
  // (e.g. the connector refuses it in updateStateAfterAlloc -> finish -> detach).
  const hit = m.getComputedBlocks({ requestId: 'a', tokenIds: tokens });
  assert.equal(hit.numComputedTokens, 32);
  const aBlocks = m.allocateSlots({ requestId: 'a', tokenIds: tokens }, 8, {
    numNewComputedTokens: 32,
    newComputedBlocks: hit.blocks,
  });
  assert.ok(aBlocks !== null);
  const aFresh = aBlocks.map((ids, g) => ids.filter((b) => !(hit.blocks[g] ?? []).includes(b)));
  m.detach('a');
  const zero = m.takeNewBlockIds();
  // c still holds every one of its pages (refCnt >= 1) and got them fresh this step: all must be zeroed.
  for (const b of cBlocks.flat()) assert.ok(m.blockPool.block(b).refCnt >= 1);
  assert.deepEqual(
    zero,
    cBlocks.flat(),
    `c's fresh pages ${JSON.stringify(cBlocks)} must all be in the zero list (a's own fresh pages ${JSON.stringify(aFresh)} may leave it)`,
  );
});
