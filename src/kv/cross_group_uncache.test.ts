/**
 * Withdrawing a failed prefix must withdraw the pages computed over it in EVERY KV cache group, not only
 * in the group of the withdrawn page (dsv4: MLA group 0 + compressor group 1).
 *
 * A forward computes every layer: the compressor (group 1) KV of block i is computed from hidden states
 * that attended over the MLA (group 0) KV of blocks < i. BlockPool linked a page only to the page before
 * it in its own group (`parent`), so the cascade of uncache (session 13) stayed inside one group. When a
 * request's prefix hit took group 0's page from one request (A, whose forward later fails) and group 1's
 * page from another (C: same hash, cached first), its group-1 page computed over A's garbage was a kid of
 * C's valid page: A's withdrawal left it cached. Once the prefix is recomputed, a later prompt hits it
 * (wrong tokens), and the KV events keep naming a hash whose KV is garbage.
 *
 * Before the fix: the last hit reached 8 tokens, its group-1 block 1 being B's page computed over A's
 * never-computed group-0 page. After: withdrawing a page withdraws the pages computed over it in every
 * group.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { KVCacheManager } from './kv_cache_manager.ts';
import { presetKVGroups } from './presets.ts';
import { makeKVCacheConfig } from './spec.ts';

const BS = 4;
const prompt = (n: number, base = 7) => Array.from({ length: n }, (_, i) => base + i);

function admit(m: KVCacheManager, id: string, tokenIds: number[]): { hit: number; blocks: number[][] } {
  const hit = m.getComputedBlocks({ requestId: id, tokenIds });
  const ok = m.allocateSlots({ requestId: id, tokenIds }, tokenIds.length - hit.numComputedTokens, {
    numNewComputedTokens: hit.numComputedTokens,
    newComputedBlocks: hit.blocks,
  });
  assert.ok(ok !== null, `room for ${id}`);
  return { hit: hit.numComputedTokens, blocks: m.getBlockIds(id) };
}

test("withdrawn prefix: a departed request's pages computed over it are withdrawn in every group", () => {
  const N = 101; // 100 usable pages
  const m = new KVCacheManager(makeKVCacheConfig(presetKVGroups('dsv4-micro', BS), N), { enableCaching: true });
  assert.equal(m.numGroups, 2);
  // C caches block 0 of the prompt in both groups; G hits it and keeps it alive past C; both leave.
  admit(m, 'c', prompt(9));
  assert.equal(admit(m, 'g', [...prompt(4), ...prompt(100, 5000)]).hit, 4);
  m.free('c');
  m.free('g');
  // Pressure evicts the LRU head up to C's group-0 page of block 0; its group-1 twin stays cached.
  admit(m, 'f', prompt(148, 9000));
  // A recomputes block 0 (group 0 missed: no hit): group 1 now has two pages under one hash, C's first.
  assert.equal(admit(m, 'a', prompt(5)).hit, 0);
  // B hits block 0: A's page in group 0, C's in group 1; it computes block 1 over them, then leaves.
  const b = admit(m, 'b', prompt(9));
  assert.equal(b.hit, 4);
  const bBlock1 = [b.blocks[0]?.[1], b.blocks[1]?.[1]];
  m.free('b');
  // A's forward failed: its pages are withdrawn, with every page computed over them.
  m.uncacheFrom('a', 0);
  m.free('a');
  // D recomputes the prefix (no hit); E then looks it up.
  assert.equal(admit(m, 'd', prompt(9)).hit, 0);
  const e = m.getComputedBlocks({ requestId: 'e', tokenIds: prompt(13) });
  e.blocks.forEach((ids, g) =>
    assert.ok(
      !ids.includes(bBlock1[g] as number),
      `E's hit (${e.numComputedTokens} tokens) takes B's group-${g} page ${bBlock1[g]}, computed over A's never-computed KV`,
    ),
  );
  m.blockPool.verify();
});
