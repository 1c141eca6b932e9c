/** Proves the block pool's vLLM v1 semantics: null block, LRU free queue, ref counts, prefix-cache eviction, hashes. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import fc from 'fast-check';
import { AssertionFailure } from '../util/assert.ts';
import { extendBlockHashes, hashBlockTokens } from './block_hash.ts';
import { BlockPool, type KVCacheBlock } from './block_pool.ts';

const ids = (blocks: KVCacheBlock[]) => blocks.map((b) => b.blockId);
const H = (n: number) => hashBlockTokens(null, [n], 0);

test('null block 0 is taken at init: never in the free queue, never handed out, never freed', () => {
  const pool = new BlockPool(5, true);
  assert.equal(pool.getNumFreeBlocks(), 4);
  assert.equal(pool.nullBlock.blockId, 0);
  assert.equal(pool.nullBlock.isNull, true);
  assert.deepEqual(pool.freeBlockIds(), [1, 2, 3, 4]);
  assert.deepEqual(ids(pool.getNewBlocks(4)), [1, 2, 3, 4]);
  assert.throws(() => pool.getNewBlocks(1), AssertionFailure);
  assert.throws(() => pool.freeBlocks([pool.nullBlock]), AssertionFailure);
  assert.equal(pool.usage(), 1);
  pool.verify();
});

test('LRU: pops from the head, frees to the tail; a request freed in reverse has its tail reused first', () => {
  const pool = new BlockPool(8, false);
  const a = pool.getNewBlocks(3); // 1,2,3
  assert.deepEqual(pool.freeBlockIds(), [4, 5, 6, 7]);
  pool.freeBlocks([...a].reverse());
  assert.deepEqual(pool.freeBlockIds(), [4, 5, 6, 7, 3, 2, 1]);
  assert.deepEqual(ids(pool.getNewBlocks(5)), [4, 5, 6, 7, 3]);
  assert.equal(pool.usage(), 5 / 7);
  pool.verify();
});

test('ref counts: a shared block returns to the queue only when its last holder frees it; no negative counts', () => {
  const pool = new BlockPool(4, true);
  const [b] = pool.getNewBlocks(1) as [KVCacheBlock];
  pool.cacheBlock(b, H(1));
  pool.touch([b]); // a second holder via a prefix hit
  assert.equal(b.refCnt, 2);
  pool.freeBlocks([b]);
  assert.equal(pool.getNumFreeBlocks(), 2, 'still held by one');
  pool.freeBlocks([b]);
  assert.equal(pool.getNumFreeBlocks(), 3);
  assert.throws(() => pool.freeBlocks([b]), /refCnt 0/);
  assert.equal(b.refCnt, 0);
  pool.verify();
});

test('prefix cache: a freed cached block stays a hit, touch takes it off the queue, reuse evicts it', () => {
  const pool = new BlockPool(4, true);
  const [b] = pool.getNewBlocks(1) as [KVCacheBlock];
  pool.cacheBlock(b, H(7));
  pool.freeBlocks([b]);
  assert.equal(pool.getCachedBlock(H(7)), b, 'free but still cached');
  pool.touch([b]);
  assert.equal(b.refCnt, 1);
  assert.ok(!pool.freeBlockIds().includes(b.blockId));
  pool.freeBlocks([b]);
  assert.deepEqual(pool.freeBlockIds(), [2, 3, 1]);
  pool.getNewBlocks(3); // reaches block 1 last: evicted
  assert.equal(pool.getCachedBlock(H(7)), null);
  assert.equal(b.blockHash, null);
  assert.equal(pool.numCachedBlocks(), 0);
  pool.verify();
});

test('two blocks may hold the same hash; evicting one leaves the other', () => {
  const pool = new BlockPool(4, true);
  const [x, y] = pool.getNewBlocks(2) as [KVCacheBlock, KVCacheBlock];
  pool.cacheBlock(x, H(1));
  pool.cacheBlock(y, H(1));
  pool.freeBlocks([x, y]);
  pool.getNewBlocks(2); // block 3, then x
  assert.equal(pool.getCachedBlock(H(1)), y);
  pool.verify();
});

test('resetPrefixCache is refused while a page is in use and clears every hash otherwise', () => {
  const pool = new BlockPool(4, true);
  const [b] = pool.getNewBlocks(1) as [KVCacheBlock];
  pool.cacheBlock(b, H(2));
  assert.equal(pool.resetPrefixCache(), false);
  assert.equal(pool.getCachedBlock(H(2)), b);
  pool.freeBlocks([b]);
  assert.equal(pool.resetPrefixCache(), true);
  assert.equal(pool.getCachedBlock(H(2)), null);
  assert.equal(b.blockHash, null);
  pool.verify();
});

test('block hash: sha256 of a fixed framing of (parent, group, tokens); every input matters', () => {
  const tokens = [5, 70000, 0, 42];
  const root = hashBlockTokens(null, tokens, 3);
  // Rebuild the framing independently: flag, 32-byte parent, u32 group, u32 count, u32 tokens (LE).
  const buf = Buffer.alloc(1 + 32 + 8 + 16);
  buf.writeUInt32LE(3, 33);
  buf.writeUInt32LE(4, 37);
  tokens.forEach((t, i) => buf.writeUInt32LE(t, 41 + 4 * i));
  assert.equal(root, createHash('sha256').update(buf).digest('hex'));
  const child = hashBlockTokens(root, tokens, 3);
  assert.notEqual(child, root);
  assert.notEqual(hashBlockTokens(null, tokens, 2), root, 'group id');
  assert.notEqual(hashBlockTokens(null, [5, 70000, 0, 43], 3), root, 'tokens');
  assert.notEqual(hashBlockTokens(H(9), tokens, 3), child, 'parent');
  // The chain helper extends an existing prefix without recomputing it.
  const chain = extendBlockHashes([], [1, 2, 3, 4, 5], 2, 0, 2);
  assert.deepEqual(chain, [
    hashBlockTokens(null, [1, 2], 0),
    hashBlockTokens(hashBlockTokens(null, [1, 2], 0), [3, 4], 0),
  ]);
  assert.throws(() => extendBlockHashes([], [1, 2, 3], 2, 0, 2), AssertionFailure);
});

type PoolOp =
  | { op: 'get'; n: number }
  | { op: 'free'; pick: number }
  | { op: 'cache'; pick: number; key: number }
  | { op: 'hit'; key: number };

const poolOp: fc.Arbitrary<PoolOp> = fc.oneof(
  fc.record({ op: fc.constant('get' as const), n: fc.integer({ min: 0, max: 4 }) }),
  fc.record({ op: fc.constant('free' as const), pick: fc.nat() }),
  fc.record({ op: fc.constant('cache' as const), pick: fc.nat(), key: fc.integer({ min: 0, max: 5 }) }),
  fc.record({ op: fc.constant('hit' as const), key: fc.integer({ min: 0, max: 5 }) }),
);

test('property: any sequence of get/free/cache/touch keeps refCnt == holders, conserves pages, never hands out block 0', () => {
  fc.assert(
    fc.property(
      fc.integer({ min: 2, max: 12 }),
      fc.array(poolOp, { minLength: 5, maxLength: 80, size: 'max' }),
      (numBlocks, ops) => {
        const pool = new BlockPool(numBlocks, true);
        const holders: KVCacheBlock[][] = [];
        for (const o of ops) {
          if (o.op === 'get') {
            if (o.n > pool.getNumFreeBlocks()) continue;
            const got = pool.getNewBlocks(o.n);
            assert.ok(got.every((b) => !b.isNull && b.blockId !== 0 && b.refCnt === 1 && b.blockHash === null));
            holders.push(got);
          } else if (o.op === 'free') {
            if (holders.length === 0) continue;
            const [h] = holders.splice(o.pick % holders.length, 1) as [KVCacheBlock[]];
            pool.freeBlocks([...h].reverse());
          } else if (o.op === 'cache') {
            const owned = holders.flat().filter((b) => b.blockHash === null);
            const b = owned[o.pick % Math.max(1, owned.length)];
            if (b !== undefined) pool.cacheBlock(b, H(o.key));
          } else {
            const b = pool.getCachedBlock(H(o.key));
            if (b !== null) {
              pool.touch([b]);
              holders.push([b]);
            }
          }
          pool.verify();
          const held = new Map<number, number>();
          for (const b of holders.flat()) held.set(b.blockId, (held.get(b.blockId) ?? 0) + 1);
          assert.ok(!held.has(0), 'null block handed out');
          for (let id = 1; id < numBlocks; id++)
            assert.equal(pool.block(id).refCnt, held.get(id) ?? 0, `refCnt of block ${id}`);
          assert.equal(pool.getNumFreeBlocks() + held.size + 1, numBlocks, 'free + held + null == all pages');
        }
      },
    ),
    { numRuns: 300 },
  );
});
