/**
 * Property test of the KV cache manager over random request lifecycles on all three presets, with and
 * without prefix caching. After every step it proves:
 *   - refCnt of every page == number of holders (requests + detached lists): never negative, no leaks;
 *   - a page is held by two holders only as a cached prefix-hit page, never with caching off;
 *   - a page belongs to one group at a time, never twice in one request, and block 0 is never held;
 *   - free + held + null == numBlocks (pages conserved);
 *   - a Mamba group holds exactly one page per request;
 *   - allocateSlots returning null changed nothing (pages, free queue, zeroing list);
 *   - a successful allocateSlots records exactly its fresh pages of recording groups for zeroing.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { KVCacheManager, type BlockIds } from './kv_cache_manager.ts';
import { MODEL_PRESETS, presetKVGroups } from './presets.ts';
import { isAttentionSpec, makeKVCacheConfig } from './spec.ts';

type Op =
  | { op: 'start'; r: number; tpl: number; len: number; useHit: boolean; external: number; lookahead: number }
  | { op: 'decode'; r: number; lookahead: number }
  | { op: 'free'; r: number }
  | { op: 'detach'; r: number }
  | { op: 'release'; pick: number }
  | { op: 'drain' };

const NUM_REQS = 4;
const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    arbitrary: fc.record({
      op: fc.constant('start' as const),
      r: fc.nat(NUM_REQS - 1),
      tpl: fc.nat(1),
      len: fc.integer({ min: 1, max: 60 }),
      useHit: fc.boolean(),
      external: fc.nat(40),
      lookahead: fc.nat(3),
    }),
    weight: 3,
  },
  {
    arbitrary: fc.record({ op: fc.constant('decode' as const), r: fc.nat(NUM_REQS - 1), lookahead: fc.nat(3) }),
    weight: 3,
  },
  fc.record({ op: fc.constant('free' as const), r: fc.nat(NUM_REQS - 1) }),
  fc.record({ op: fc.constant('detach' as const), r: fc.nat(NUM_REQS - 1) }),
  fc.record({ op: fc.constant('release' as const), pick: fc.nat() }),
  fc.record({ op: fc.constant('drain' as const) }),
);

interface ModelReq {
  tokens: number[];
  numComputed: number;
}

test('property: allocate/decode/free/detach/release/hit sequences keep page ownership exact on every preset', () => {
  fc.assert(
    fc.property(
      fc.constantFrom(...MODEL_PRESETS),
      fc.integer({ min: 2, max: 32 }),
      fc.boolean(),
      fc.array(opArb, { minLength: 5, maxLength: 60, size: 'max' }),
      (preset, numBlocks, enableCaching, ops) => {
        const config = makeKVCacheConfig(presetKVGroups(preset), numBlocks);
        const m = new KVCacheManager(config, { enableCaching });
        const pool = m.blockPool;
        const recording = config.groups.map((g) => config.needsKvCacheZeroing && isAttentionSpec(g.spec));
        const reqs = new Map<string, ModelReq>();
        const pending: BlockIds[] = [];
        let decodeToken = 50_000;

        const snapshot = () =>
          JSON.stringify([
            pool.freeBlockIds(),
            [...reqs.keys()].map((id) => m.getBlockIds(id)),
            pool.numCachedBlocks(),
            m.numRequests(),
          ]);

        // Allocate through the manager the way the scheduler does; check all-or-nothing and recording.
        const allocate = (
          id: string,
          r: ModelReq,
          numNew: number,
          opts: Parameters<KVCacheManager['allocateSlots']>[2],
          hits: BlockIds,
        ) => {
          m.takeNewBlockIds();
          const before = snapshot();
          const added = m.allocateSlots(
            { requestId: id, tokenIds: r.tokens, numComputedTokens: r.numComputed },
            numNew,
            opts,
          );
          if (added === null) {
            assert.equal(snapshot(), before, 'a failed allocation changed state');
            assert.deepEqual(m.takeNewBlockIds(), [], 'a failed allocation recorded pages');
            return false;
          }
          const fresh = added.flatMap((ids, g) =>
            recording[g] ? ids.filter((b) => !(hits[g] ?? []).includes(b)) : [],
          );
          assert.deepEqual(m.takeNewBlockIds(), fresh, 'recorded pages == fresh pages of recording groups');
          return true;
        };

        for (const o of ops) {
          if (o.op === 'start') {
            const id = `r${o.r}`;
            if (reqs.has(id)) continue;
            const r: ModelReq = { tokens: Array.from({ length: o.len }, (_, i) => o.tpl * 1000 + i), numComputed: 0 };
            const hit = o.useHit
              ? m.getComputedBlocks({ requestId: id, tokenIds: r.tokens })
              : { blocks: config.groups.map(() => []), numComputedTokens: 0 };
            const rest = o.len - hit.numComputedTokens;
            const external = Math.min(o.external, rest - 1);
            const ok = allocate(
              id,
              r,
              rest - external,
              {
                numNewComputedTokens: hit.numComputedTokens,
                newComputedBlocks: hit.blocks,
                numExternalComputedTokens: external,
                numLookaheadTokens: o.lookahead,
              },
              hit.blocks,
            );
            if (ok) reqs.set(id, { ...r, numComputed: o.len });
          } else if (o.op === 'decode') {
            const id = `r${o.r}`;
            const r = reqs.get(id);
            if (r === undefined) continue;
            r.tokens.push(decodeToken++);
            if (
              allocate(
                id,
                r,
                1,
                { numLookaheadTokens: o.lookahead },
                config.groups.map(() => []),
              )
            )
              r.numComputed = r.tokens.length;
            else r.tokens.pop();
          } else if (o.op === 'free' || o.op === 'detach') {
            const id = `r${o.r}`;
            if (o.op === 'free') m.free(id);
            else pending.push(m.detach(id));
            reqs.delete(id);
          } else if (o.op === 'release') {
            if (pending.length > 0) m.freeBlockIds(pending.splice(o.pick % pending.length, 1)[0] as BlockIds);
          } else {
            m.takeNewBlockIds();
          }

          pool.verify();
          assert.equal(m.numRequests(), reqs.size);
          const holders: BlockIds[] = [...[...reqs.keys()].map((id) => m.getBlockIds(id)), ...pending];
          const count = new Map<number, number>();
          const groupOf = new Map<number, number>();
          for (const h of holders) {
            const flat = h.flat();
            assert.equal(new Set(flat).size, flat.length, 'a page twice in one request');
            h.forEach((ids, g) => {
              if (config.groups[g]?.spec.type === 'mamba' && reqs.size + pending.length > 0)
                assert.ok(ids.length <= 1, 'Mamba holds one page');
              for (const b of ids) {
                assert.notEqual(b, 0, 'null block handed out');
                assert.equal(groupOf.get(b) ?? g, g, `page ${b} in two groups`);
                groupOf.set(b, g);
                count.set(b, (count.get(b) ?? 0) + 1);
              }
            });
          }
          for (let b = 1; b < numBlocks; b++) {
            const block = pool.block(b);
            assert.equal(block.refCnt, count.get(b) ?? 0, `refCnt of page ${b}`);
            if (block.refCnt > 1)
              assert.ok(enableCaching && block.blockHash !== null, `page ${b} shared without a prefix hit`);
          }
          assert.equal(m.getNumFreeBlocks() + count.size + 1, numBlocks, 'pages conserved');
          for (const id of reqs.keys()) {
            config.groups.forEach((g, gi) => {
              if (g.spec.type === 'mamba')
                assert.equal(m.getBlockIds(id)[gi]?.length, 1, 'a running request has its Mamba page');
            });
          }
        }
        // Everything returned: the pool is whole again.
        for (const id of [...reqs.keys()]) m.free(id);
        for (const p of pending) m.freeBlockIds(p);
        assert.equal(m.getNumFreeBlocks(), numBlocks - 1);
        assert.equal(m.usage(), 0);
      },
    ),
    { numRuns: 1500 },
  );
});
