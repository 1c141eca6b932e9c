/**
 * KvRouter without sockets: a RouterIndex filled with the hashes instances would publish. Proves the
 * decode-first choice by prefix overlap × weight − load, the prefix-based skip of the remote prefill,
 * load overriding overlap, a hit counted only where every cached group holds it, the instance's own cap
 * (the last prompt token is always computed), exclusion of failed members, and round robin on ties.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { extendBlockHashes } from '../kv/block_hash.ts';
import { InstancePool, type PoolMember } from './instance_pool.ts';
import type { InstanceInfo } from './instance_server.ts';
import { hitTokensOf, KvRouter, PromptChains } from './kv_router.ts';
import { RouterIndex } from './router_index.ts';

const BS = 16;

function info(role: 'prefill' | 'decode'): InstanceInfo {
  return {
    engine_id: role,
    role,
    model: 'm',
    preset: 'dsv4-mini',
    kv_role: role === 'prefill' ? 'kv_producer' : 'kv_consumer',
    transfer_mode: 'read',
    side_channel_host: null,
    side_channel_port: null,
    data_port: null,
    max_model_len: 1024,
    num_pages: 100,
    block_size: BS,
    prefix_cache_groups: [0, 1],
    kv_events_epoch: 'e',
  };
}

function setup() {
  const prefill = new InstancePool('prefill', ['http://p0', 'http://p1'], 'kv-aware');
  const decode = new InstancePool('decode', ['http://d0', 'http://d1'], 'kv-aware');
  for (const m of prefill.members) prefill.markUp(m, info('prefill'));
  for (const m of decode.members) decode.markUp(m, info('decode'));
  const index = new RouterIndex();
  return { pools: { prefill, decode }, index };
}

/** `m` holds the first `blocks` blocks of `tokens` in the given groups. */
function hold(index: RouterIndex, m: PoolMember, tokens: number[], blocks: number, groups = [0, 1]): void {
  const hashes = groups.flatMap((g) => extendBlockHashes([], tokens, BS, g, blocks));
  index.applyDump(m.url, { epoch: 'e', seq: 1, block_hashes: [...index.hashesOf(m.url), ...hashes] });
}

const prompt = (n: number, base = 0): number[] => Array.from({ length: n }, (_, i) => base + (i % 5000));

test('decode with the prefix wins; the remote prefill is skipped when the uncached rest is short', () => {
  const { pools, index } = setup();
  const [d0, d1] = pools.decode.members as [PoolMember, PoolMember];
  const t = prompt(200);
  hold(index, d1, t, 10); // 160 of 200 tokens
  const router = new KvRouter(index, { kvWeight: 4, skipPrefillMaxTokens: 64 });
  const r = router.route(pools, t);
  assert.equal(r?.decode, d1);
  assert.equal(r?.decodeHitTokens, 160);
  assert.equal(r?.prefill, null, '40 uncached tokens <= 64: decode computes them');
  const strict = new KvRouter(index, { kvWeight: 4, skipPrefillMaxTokens: 16 });
  const r2 = strict.route(pools, t);
  assert.equal(r2?.decode, d1);
  assert.notEqual(r2?.prefill, null, '40 > 16: a remote prefill');
  d1.inflight = 5;
  assert.equal(strict.route(pools, t)?.decode, d0, 'load 5 outweighs a 0.8 × 4 = 3.2 hit');
  d1.inflight = 0;
  d1.load = { running: 6, waiting: 0, held_for_send: 0, held_for_send_pages: 0, free_pages: 1, total_pages: 9 };
  assert.equal(strict.route(pools, t)?.decode, d0, 'reported load counts too');
});

test('prefill is chosen by its own prefix; excluded and unhealthy members are skipped', () => {
  const { pools, index } = setup();
  const [p0, p1] = pools.prefill.members as [PoolMember, PoolMember];
  const t = prompt(300, 7);
  hold(index, p1, t, 12);
  const router = new KvRouter(index, { kvWeight: 4, skipPrefillMaxTokens: 0 });
  for (let i = 0; i < 3; i++) assert.equal(router.route(pools, t)?.prefill, p1);
  assert.equal(router.route(pools, t, new Set([p1]))?.prefill, p0, 'p1 failed this request: excluded');
  pools.prefill.markDown(p0, 'gone');
  assert.equal(router.route(pools, t, new Set([p1])), null, 'no prefill left');
});

test('a hit counts only where every prefix-cached group holds it, capped below the whole prompt', () => {
  const { pools, index } = setup();
  const d0 = pools.decode.members[0] as PoolMember;
  const t = prompt(64); // 4 full blocks, but at most 3 can be hits (the last token is computed)
  hold(index, d0, t, 4, [0]);
  hold(index, d0, t, 2, [1]);
  assert.equal(hitTokensOf(index, d0, new PromptChains(t)), 2 * BS, 'group 1 holds only 2 blocks');
  hold(index, d0, t, 4, [1]);
  assert.equal(hitTokensOf(index, d0, new PromptChains(t)), 3 * BS, 'capped at 3 blocks of a 64-token prompt');
});

test('with no overlap anywhere, equal instances take turns', () => {
  const { pools, index } = setup();
  const router = new KvRouter(index, { kvWeight: 4, skipPrefillMaxTokens: 64 });
  const got = [0, 1, 2, 3].map((i) => router.route(pools, prompt(100, i * 100))?.decode.url);
  assert.deepEqual(got, ['http://d0', 'http://d1', 'http://d0', 'http://d1']);
});
