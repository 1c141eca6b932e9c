/**
 * The router's index against a real pool: random request lifecycles (shared prefixes, evictions,
 * withdrawn pages, resets, restarts) on a KVCacheManager publish batches that reach the index through
 * a channel that drops, duplicates and reorders them. Proves: whenever the index has caught up (its
 * applied seq is the publisher's, after replay or after a dump), its set for the instance equals the
 * pool's cached-hash set; a lost tail is found by a heartbeat; a restart (new epoch) forgets the old life.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { KVCacheManager } from '../kv/kv_cache_manager.ts';
import { kvEventEpoch, type KvEventBatch, type KvEventPublisher } from '../kv/kv_events.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import { RouterIndex } from './router_index.ts';

const BS = 4;

type Op =
  | { op: 'run'; r: number; prefix: number; len: number }
  | { op: 'free'; r: number }
  | { op: 'uncache'; r: number; from: number }
  | { op: 'reset' }
  | { op: 'restart' };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    arbitrary: fc.record({
      op: fc.constant('run' as const),
      r: fc.nat(5),
      prefix: fc.nat(2),
      len: fc.integer({ min: 1, max: 30 }),
    }),
    weight: 4,
  },
  { arbitrary: fc.record({ op: fc.constant('free' as const), r: fc.nat(5) }), weight: 3 },
  fc.record({ op: fc.constant('uncache' as const), r: fc.nat(5), from: fc.nat(20) }),
  fc.record({ op: fc.constant('reset' as const) }),
  { arbitrary: fc.record({ op: fc.constant('restart' as const) }), weight: 1 },
);

/** What the channel does to one batch. */
type Fate = 'deliver' | 'drop' | 'dup' | 'delay';
const fateArb = fc.constantFrom<Fate>('deliver', 'deliver', 'deliver', 'drop', 'dup', 'delay');

class Instance {
  m!: KVCacheManager;
  pub!: KvEventPublisher;
  epoch = 0;
  readonly live = new Set<string>();
  readonly out: KvEventBatch[] = [];

  constructor() {
    this.start();
  }

  start(): void {
    this.m = new KVCacheManager(makeKVCacheConfig(presetKVGroups('dsv4-micro', BS), 24), { enableCaching: true });
    this.pub = this.m.publishKvEvents({ epoch: kvEventEpoch(++this.epoch, 'life'), wallMs: () => 0 });
    this.pub.subscribe((b) => this.out.push(b));
    this.live.clear();
  }

  apply(o: Op): void {
    const id = `r${'r' in o ? o.r : 0}`;
    if (o.op === 'run' && !this.live.has(id)) {
      const tokenIds = [...Array.from({ length: 8 }, (_, i) => o.prefix * 100 + i), ...range(o.len, o.r * 1000)];
      const hit = this.m.getComputedBlocks({ requestId: id, tokenIds });
      const got = this.m.allocateSlots({ requestId: id, tokenIds }, tokenIds.length - hit.numComputedTokens, {
        numNewComputedTokens: hit.numComputedTokens,
        newComputedBlocks: hit.blocks,
      });
      if (got) this.live.add(id);
    } else if (o.op === 'free' && this.live.delete(id)) this.m.free(id);
    else if (o.op === 'uncache' && this.live.has(id)) this.m.uncacheFrom(id, o.from);
    else if (o.op === 'reset') this.m.resetPrefixCache();
    else if (o.op === 'restart') this.start();
    this.pub.flush();
  }

  caughtUp(index: RouterIndex): boolean {
    const p = index.position('i');
    return p.epoch === this.pub.epoch && p.seq === this.pub.seq;
  }
}

const range = (n: number, base: number): number[] => Array.from({ length: n }, (_, i) => base + i);

function deliver(index: RouterIndex, inst: Instance, fates: Fate[], delayed: KvEventBatch[], k: number): void {
  for (const b of inst.out.splice(0)) {
    const fate = fates[k++ % fates.length] as Fate;
    if (fate === 'drop') continue;
    if (fate === 'delay') {
      delayed.push(b);
      continue;
    }
    index.applyBatch('i', b);
    if (fate === 'dup') index.applyBatch('i', b);
  }
}

test('property: the index rebuilt from lossy, duplicated, reordered batches (plus dumps) equals the pool set once caught up', () => {
  fc.assert(
    fc.property(
      fc.array(opArb, { minLength: 1, maxLength: 60 }),
      fc.array(fateArb, { minLength: 1, maxLength: 20 }),
      fc.nat(4),
      (ops, fates, maxPending) => {
        const inst = new Instance();
        const index = new RouterIndex({ maxPending, maxHashesPerInstance: 1 << 20 });
        const delayed: KvEventBatch[] = [];
        let k = 0;
        for (const o of ops) {
          inst.apply(o);
          deliver(index, inst, fates, delayed, k++);
          // Late batches arrive after newer ones (a reorder), sometimes.
          if (k % 3 === 0) for (const b of delayed.splice(0).reverse()) index.applyBatch('i', b);
          if (index.needsDump('i')) index.applyDump('i', inst.pub.dump());
          if (inst.caughtUp(index) && index.position('i').pending === 0)
            assert.deepEqual(new Set(index.hashesOf('i')), new Set(inst.m.blockPool.cachedHashes()));
        }
        // Quiescence: stragglers land, a heartbeat reveals any lost tail, a dump repairs it.
        for (const b of delayed.splice(0)) index.applyBatch('i', b);
        if (index.heartbeat('i', inst.pub.epoch, inst.pub.seq)) index.applyDump('i', inst.pub.dump());
        assert.ok(inst.caughtUp(index), 'caught up after heartbeat and dump');
        assert.deepEqual(new Set(index.hashesOf('i')), new Set(inst.m.blockPool.cachedHashes()));
      },
    ),
    { numRuns: 400 },
  );
});

test('duplicates are ignored, a gap waits for the missing batch, a restart drops the old life', () => {
  const index = new RouterIndex({ maxPending: 2, maxHashesPerInstance: 100 });
  const stored = (h: string) => ({
    type: 'BlockStored' as const,
    block_hashes: [h],
    parent_block_hash: null,
    token_ids: [1],
    block_size: 1,
    lora_id: null,
    medium: 'GPU',
    group_idx: 0,
  });
  const b = (seq: number, h: string, epoch = 'a'): KvEventBatch => ({ epoch, seq, ts: 0, events: [stored(h)] });
  assert.equal(index.applyBatch('p', b(1, 'x')), 'applied');
  assert.equal(index.applyBatch('p', b(1, 'x')), 'duplicate');
  assert.equal(index.applyBatch('p', b(3, 'z')), 'buffered');
  assert.deepEqual([...index.hashesOf('p')], ['x'], 'batch 3 waits for 2');
  assert.equal(index.applyBatch('p', b(2, 'y')), 'applied');
  assert.deepEqual([...index.hashesOf('p')].sort(), ['x', 'y', 'z']);
  assert.equal(index.prefixLength('p', ['x', 'y', 'q', 'z']), 2, 'a prefix stops at the first miss');
  assert.equal(index.applyBatch('p', b(5, 'v')), 'buffered');
  assert.equal(index.applyBatch('p', b(6, 'w')), 'buffered');
  assert.equal(index.applyBatch('p', b(7, 'u')), 'needs-dump', 'more than maxPending waiting');
  index.applyDump('p', { epoch: 'a', seq: 6, block_hashes: ['x'] });
  assert.deepEqual([...index.hashesOf('p')].sort(), ['u', 'x'], 'the dump at 6, then the pending 7 on top');
  assert.equal(index.applyBatch('p', b(1, 'n', 'b')), 'applied', 'a new epoch starts over');
  assert.deepEqual([...index.hashesOf('p')], ['n']);
  assert.equal(index.applyBatch('p', b(7, 'old', 'a')), 'duplicate', 'a late batch of the old life is stale');
  index.applyDump('p', { epoch: 'a', seq: 9, block_hashes: ['old'] });
  assert.deepEqual([...index.hashesOf('p')], ['n'], 'a late dump of the old life changes nothing');
  assert.equal(index.heartbeat('p', 'a', 9), false, 'nor does its heartbeat');
  assert.equal(index.heartbeat('p', 'b', 1), false, 'caught up');
  assert.equal(index.heartbeat('p', 'b', 2), true, 'the instance is ahead of us: batch 2 was lost');
  // Ordered epochs: a life that started earlier, heard of only now (its batch was late), is stale.
  assert.equal(index.applyBatch('q', b(1, 'new', kvEventEpoch(200, 'q'))), 'applied');
  assert.equal(index.applyBatch('q', b(1, 'old', kvEventEpoch(100, 'q'))), 'duplicate');
  assert.deepEqual([...index.hashesOf('q')], ['new']);
  assert.equal(index.applyBatch('q', b(1, 'newer', kvEventEpoch(300, 'q'))), 'applied', 'a later life replaces it');
  assert.deepEqual([...index.hashesOf('q')], ['newer']);
});

const hexOf = (n: number): string => n.toString(16).padStart(64, '0');
const storedBatch = (seq: number, hashes: string[]): KvEventBatch => ({
  epoch: '1-e',
  seq,
  ts: 0,
  events: [
    {
      type: 'BlockStored',
      block_hashes: hashes,
      parent_block_hash: null,
      token_ids: [],
      block_size: 1,
      lora_id: null,
      medium: 'GPU',
      group_idx: 0,
    },
  ],
});

test('a feed that keeps running ahead of its own dumps holds at most the bound in pending, and a dump over the bound is not adopted in part', () => {
  const index = new RouterIndex({ maxPending: 0, maxHashesPerInstance: 100 });
  index.applyBatch('p', storedBatch(1, [hexOf(1)]));
  for (let line = 0; line < 1000; line++) {
    const hashes = Array.from({ length: 60 }, (_, i) => hexOf(line * 100 + i + 10));
    index.applyBatch('p', storedBatch(1_000_000 + line, hashes));
    // The instance's dump stays at its real seq 1: the batches ahead of it never come.
    if (index.needsDump('p')) index.applyDump('p', { epoch: '1-e', seq: 1, block_hashes: [hexOf(1)] });
    assert.ok(index.position('p').pending <= 1, `line ${line}: ${index.position('p').pending} batches pending`);
  }
  assert.deepEqual([...index.hashesOf('p')], [hexOf(1)]);

  const small = new RouterIndex({ maxPending: 0, maxHashesPerInstance: 4 });
  small.applyDump('p', { epoch: '1-e', seq: 5, block_hashes: Array.from({ length: 7 }, (_, i) => hexOf(i + 1)) });
  assert.equal(small.hashesOf('p').size, 0, 'none of a dump over the bound, not its tail');
  assert.equal(small.position('p').seq, 5);
  small.applyBatch('p', storedBatch(6, [hexOf(9)]));
  assert.deepEqual([...small.hashesOf('p')], [hexOf(9)], 'later batches apply on top');
});
