/**
 * KV events from the pool (set semantics) and the publisher's batching: what is emitted when pages are
 * cached, shared, evicted, withdrawn and reset; sequence numbers, the replay ring and dumps.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BlockPool, type KVCacheBlock } from './block_pool.ts';
import { KVCacheManager } from './kv_cache_manager.ts';
import { KvEventPublisher, type KvCacheEvent, type KvEventBatch } from './kv_events.ts';
import { presetKVGroups } from './presets.ts';
import { makeKVCacheConfig } from './spec.ts';

const BS = 4;

function manager(numBlocks = 12) {
  const m = new KVCacheManager(makeKVCacheConfig(presetKVGroups('llama-micro', BS), numBlocks), {
    enableCaching: true,
  });
  const pub = m.publishKvEvents({ epoch: 'e1', wallMs: () => 5000 });
  const batches: KvEventBatch[] = [];
  pub.subscribe((b) => batches.push(b));
  return { m, pub, batches };
}

/** Allocate and cache a whole prompt the way the scheduler does for a request computed locally. */
function run(m: KVCacheManager, requestId: string, tokenIds: number[]): void {
  const hit = m.getComputedBlocks({ requestId, tokenIds });
  const ok = m.allocateSlots({ requestId, tokenIds }, tokenIds.length - hit.numComputedTokens, {
    numNewComputedTokens: hit.numComputedTokens,
    newComputedBlocks: hit.blocks,
  });
  assert.ok(ok, 'the pool has room');
}

const events = (bs: KvEventBatch[]): KvCacheEvent[] => bs.flatMap((b) => b.events);

test('BlockStored names new hashes with their parent, tokens, block size and group; a shared prefix is stored once', () => {
  const { m, pub, batches } = manager();
  const a = [1, 2, 3, 4, 5, 6, 7, 8, 9];
  run(m, 'a', a);
  pub.flush();
  const [stored] = events(batches);
  assert.equal(stored?.type, 'BlockStored');
  if (stored?.type !== 'BlockStored') return;
  assert.equal(stored.block_hashes.length, 2, 'two full blocks of 9 tokens at 4 per page');
  assert.equal(stored.parent_block_hash, null);
  assert.deepEqual(stored.token_ids, a.slice(0, 8));
  assert.equal(stored.block_size, BS);
  assert.equal(stored.group_idx, 0);
  assert.equal(stored.medium, 'GPU');
  // Same first block, other second block: only the second is new, its parent is the shared first.
  run(m, 'b', [1, 2, 3, 4, 50, 51, 52, 53, 54]);
  pub.flush();
  const second = events(batches).slice(1);
  assert.equal(second.length, 1);
  const s2 = second[0];
  assert.ok(s2?.type === 'BlockStored');
  assert.deepEqual(s2.token_ids, [50, 51, 52, 53]);
  assert.equal(s2.parent_block_hash, stored.block_hashes[0]);
  assert.deepEqual(new Set(m.blockPool.cachedHashes()), new Set([...stored.block_hashes, ...s2.block_hashes]));
});

test('BlockRemoved only when the last page of a hash leaves; AllBlocksCleared on reset; withdrawn pages are removed', () => {
  const { m, pub, batches } = manager(6); // 5 usable pages
  run(m, 'a', [1, 2, 3, 4, 5, 6, 7, 8, 9]); // 3 pages, 2 cached
  m.free('a');
  run(m, 'b', [9, 9, 9, 9, 9]); // 2 pages: the free queue's head first (a's never-cached tail page, then...)
  m.free('b');
  pub.flush();
  const cachedNow = new Set(m.blockPool.cachedHashes());
  const replayed = new Set<string>();
  for (const ev of events(batches)) {
    if (ev.type === 'BlockStored') ev.block_hashes.forEach((h) => replayed.add(h));
    if (ev.type === 'BlockRemoved') ev.block_hashes.forEach((h) => replayed.delete(h));
  }
  assert.deepEqual(replayed, cachedNow, 'the events replayed give the pool set');
  run(m, 'c', [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7]); // needs 4 pages: evicts cached ones
  pub.flush();
  assert.ok(
    events(batches).some((e) => e.type === 'BlockRemoved'),
    'evicting a cached page for reuse emits BlockRemoved',
  );
  const before = events(batches).length;
  m.uncacheFrom('c', 0);
  pub.flush();
  const withdrawn = events(batches).slice(before);
  assert.ok(withdrawn.length > 0 && withdrawn.every((e) => e.type === 'BlockRemoved'));
  m.free('c');
  assert.equal(m.resetPrefixCache(), true);
  pub.flush();
  assert.equal(events(batches).at(-1)?.type, 'AllBlocksCleared');
});

test('batches close at the end of the synchronous run; seq is monotonic; since() replays or says gap; dump agrees', async () => {
  let hashes = ['h0'];
  const pub = new KvEventPublisher({ epoch: 'x', wallMs: () => 1500, snapshot: () => hashes, replayMax: 3 });
  pub.emit({ type: 'AllBlocksCleared' });
  pub.emit({ type: 'AllBlocksCleared' });
  assert.equal(pub.seq, 0, 'nothing closed yet');
  await Promise.resolve();
  assert.equal(pub.seq, 1, 'one batch for one synchronous run');
  assert.equal(pub.since(0)?.[0]?.events.length, 2);
  assert.equal(pub.since(0)?.[0]?.ts, 1.5);
  for (let i = 0; i < 4; i++) {
    pub.emit({ type: 'AllBlocksCleared' });
    pub.flush();
  }
  assert.equal(pub.seq, 5);
  assert.deepEqual(
    pub.since(2)?.map((b) => b.seq),
    [3, 4, 5],
  );
  assert.equal(pub.since(1), null, 'batch 2 left the ring: gap');
  assert.deepEqual(pub.since(5), []);
  assert.equal(pub.since(9), null, 'a seq from the future (another epoch) is a gap');
  hashes = ['h1', 'h2'];
  pub.emit({ type: 'BlockRemoved', block_hashes: ['h0'], medium: 'GPU' });
  const d = pub.dump();
  assert.deepEqual(d, { epoch: 'x', seq: 6, block_hashes: ['h1', 'h2'] }, 'dump flushes first: its seq covers it');
});

test('no events without prefix caching, and publishing starts only on an empty cache', () => {
  const m = new KVCacheManager(makeKVCacheConfig(presetKVGroups('llama-micro', BS), 8), { enableCaching: false });
  const pub = m.publishKvEvents({ epoch: 'e', wallMs: () => 0 });
  const got: KvEventBatch[] = [];
  pub.subscribe((b) => got.push(b));
  run(m, 'a', [1, 2, 3, 4, 5, 6, 7, 8, 9]);
  m.free('a');
  pub.flush();
  assert.equal(got.length, 0);
  const cached = manager();
  run(cached.m, 'a', [1, 2, 3, 4, 5]);
  assert.throws(() => cached.m.publishKvEvents({ epoch: 'again', wallMs: () => 0 }), /already publishes/);
});

test('two pages under one hash: evicting the first emits nothing, the second emits BlockRemoved', () => {
  const pool = new BlockPool(4, true);
  const got: KvCacheEvent[] = [];
  pool.publishEvents({ emit: (e) => got.push(e) });
  const [x, y] = pool.getNewBlocks(2) as [KVCacheBlock, KVCacheBlock];
  const h = 'a'.repeat(64);
  assert.equal(pool.cacheBlock(x, h), true, 'first page of the hash: new');
  assert.equal(pool.cacheBlock(y, h), false, 'second page: not new');
  pool.freeBlocks([x, y]);
  pool.getNewBlocks(2); // the free page (3) first, then x: x is evicted, y still holds h
  assert.deepEqual(got, []);
  pool.getNewBlocks(1); // y
  assert.deepEqual(got, [{ type: 'BlockRemoved', block_hashes: [h], medium: 'GPU' }]);
});
