/**
 * The router index's bound on batches waiting out of order (a gap before them) is meant to hold against a
 * hostile or broken instance: at most 1,024 batches and as many hashes as the set itself. But a waiting
 * batch was kept whole, and the hash count was all that was charged: a BlockStored's token_ids (and any
 * other field the line carried), or events naming no hash at all (AllBlocksCleared, an empty
 * BlockRemoved), cost nothing. A feed that keeps a gap open (its dump failing, so the connection is
 * cut, and the waiting batches survive the reconnect) made the proxy hold up to 1,024 lines of 32 MiB
 * each: its heap grew by hundreds of MiB here, for batches naming 100 hashes in all. Now a waiting batch
 * keeps only what the index applies (types and hashes), and every event counts toward the bound.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import type { KvCacheEvent, KvEventBatch } from '../kv/kv_events.ts';
import { RouterIndex, DEFAULT_ROUTER_INDEX_OPTIONS } from './router_index.ts';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

const hexOf = (n: number): string => n.toString(16).padStart(64, '0');
const batch = (seq: number, events: KvCacheEvent[]): KvEventBatch => ({ epoch: '1-e', seq, ts: 0, events });

function heapMiB(): number {
  gc();
  gc();
  return process.memoryUsage().heapUsed / (1 << 20);
}

test('batches waiting behind a gap hold no more than their hashes, whatever else their lines carry', () => {
  // The bound scaled down (the proxy's is 1 Mi hashes, like the set's own), so the test's heap stays small.
  const index = new RouterIndex({ ...DEFAULT_ROUTER_INDEX_OPTIONS, maxHashesPerInstance: 1 << 16 });
  index.applyBatch('p', batch(1, [{ type: 'AllBlocksCleared' }]));
  const before = heapMiB();
  // Seq 2 never comes: every later batch waits.
  for (let i = 0; i < 100; i++) {
    const stored: KvCacheEvent = {
      type: 'BlockStored',
      block_hashes: [hexOf(i + 1)],
      parent_block_hash: null,
      token_ids: Array.from({ length: 1 << 18 }, (_, k) => k & 0xffff), // 2 MiB of heap each
      block_size: 16,
      lora_id: null,
      medium: 'GPU',
      group_idx: 0,
    };
    index.applyBatch('p', batch(3 + i, [stored]));
  }
  for (let i = 0; i < 100; i++) {
    const clears: KvCacheEvent[] = Array.from({ length: 1 << 16 }, () => ({ type: 'AllBlocksCleared' }));
    index.applyBatch('p', batch(103 + i, clears));
  }
  const grown = heapMiB() - before;
  assert.ok(grown < 32, `the index holds ${grown.toFixed(0)} MiB for batches naming 100 hashes`);
  assert.ok(index.needsDump('p'), 'the gap still asks for a dump');
});
