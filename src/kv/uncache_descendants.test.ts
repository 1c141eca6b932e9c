/**
 * Withdrawing a prefix (uncacheFrom / uncacheBlockIds: its KV was never computed) left
 * the pages other requests had computed ON TOP of it in the prefix cache when those requests had already
 * left (finished or aborted: their pages are free, or held only by the scheduler's deferred-free fence).
 * holdersOf() only sees requests the manager still tracks, so nobody withdrew those descendant pages.
 *
 * They stay cached under their chain hash, unreachable only until some request recomputes the withdrawn
 * prefix (same tokens, so the same hashes): from then on a prompt with that prefix hits the descendant
 * page, whose KV was computed attending over the garbage of the withdrawn pages (wrong tokens). The
 * KV events also named a child hash whose parent had been removed (an orphan in a router's index).
 *
 * Before the fix: the last hit below reached 3 blocks, the third being b's page computed over a's
 * never-computed pages. After: withdrawing a page withdraws every cached page chained under its hash.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { KVCacheManager } from './kv_cache_manager.ts';
import type { KvCacheEvent } from './kv_events.ts';
import { presetKVGroups } from './presets.ts';
import { makeKVCacheConfig } from './spec.ts';

const BS = 4;
const prompt = (n: number) => Array.from({ length: n }, (_, i) => 7 + i);

function setup() {
  const m = new KVCacheManager(makeKVCacheConfig(presetKVGroups('dsv4-micro', BS), 40), { enableCaching: true });
  const events: KvCacheEvent[] = [];
  m.publishKvEvents({ epoch: 'e', wallMs: () => 0 }).subscribe((b) => events.push(...b.events));
  return { m, events };
}

/** Admit `id` with a local prefix hit and publish its pages, as the scheduler does. */
function admit(m: KVCacheManager, id: string, tokenIds: number[]): number {
  const hit = m.getComputedBlocks({ requestId: id, tokenIds });
  const ok = m.allocateSlots({ requestId: id, tokenIds }, tokenIds.length - hit.numComputedTokens, {
    numNewComputedTokens: hit.numComputedTokens,
    newComputedBlocks: hit.blocks,
  });
  assert.ok(ok !== null, 'room');
  return hit.numComputedTokens;
}

for (const leaves of ['free', 'detach'] as const) {
  test(`withdrawn prefix: a departed (${leaves}) request's pages computed over it are withdrawn too`, () => {
    const { m } = setup();
    admit(m, 'a', prompt(9)); // a publishes blocks 0, 1 (its forward will fail)
    assert.equal(admit(m, 'b', prompt(13)), 8, 'b hits a blocks 0-1 and computes block 2 over them');
    const fence = leaves === 'detach' ? m.detach('b') : (m.free('b'), null); // b leaves before a's failure
    assert.deepEqual(m.uncacheFrom('a', 0), [], "a's forward failed: nobody tracked holds its pages");
    m.free('a');
    if (fence) m.freeBlockIds(fence);
    // c recomputes the prefix (a miss: it was withdrawn) and publishes valid blocks 0, 1 again.
    assert.equal(admit(m, 'c', prompt(9)), 0);
    const hit = m.getComputedBlocks({ requestId: 'd', tokenIds: prompt(14) });
    assert.equal(hit.numComputedTokens, 8, "d must not hit b's block 2, computed over a's never-computed KV");
  });
}

test('withdrawn prefix: KV events never leave a cached child whose parent hash was removed', async () => {
  const { m, events } = setup();
  admit(m, 'a', prompt(9));
  admit(m, 'b', prompt(13));
  m.free('b');
  m.uncacheFrom('a', 0);
  await Promise.resolve();
  const cached = new Set<string>();
  const parentOf = new Map<string, string | null>();
  for (const e of events) {
    if (e.type === 'BlockRemoved') e.block_hashes.forEach((h) => cached.delete(h));
    if (e.type !== 'BlockStored') continue;
    let parent = e.parent_block_hash;
    for (const h of e.block_hashes) (cached.add(h), parentOf.set(h, parent), (parent = h));
  }
  for (const h of cached) {
    const p = parentOf.get(h);
    assert.ok(p === null || p === undefined || cached.has(p), `hash ${h.slice(0, 8)} cached, its parent removed`);
  }
});
