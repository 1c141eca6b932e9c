/**
 * Property test (kv layer): random allocate / decode / prefix-hit / external-load / free / detach /
 * fence-release / failed-forward withdrawal (uncacheFrom, holders cascaded the way step_failures.ts does,
 * then freed) / reset sequences on the dsv4 (MLA fp8 + compressor f32), llama and a mixed-block-size
 * config. After every operation it checks:
 *   - a prefix hit's page holds exactly the hit tokens' KV, computed over valid KV only;
 *   - the KV events replayed give the pool's cached-hash set: no removed-without-stored, no stored twice,
 *     a stored block's parent is cached, and no cached hash outlives its parent's;
 *   - the pool's invariants (verify) and its free count == pages held by nobody.
 * Before the fix it failed (about 1 run in 1000): a request that hit a prefix and computed a block on top
 * of it left; the prefix was then withdrawn (its forward failed) and the departed request's block stayed
 * cached (`child cached without its parent`), to be hit once the prefix is recomputed.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { KVCacheManager } from './kv_cache_manager.ts';
import type { KvCacheEvent } from './kv_events.ts';
import { presetKVGroups } from './presets.ts';
import { makeKVCacheConfig, type KVCacheGroupSpec } from './spec.ts';

function configs(): Array<{ name: string; groups: KVCacheGroupSpec[] }> {
  const mixed: KVCacheGroupSpec[] = [
    {
      groupId: 0,
      layerNames: ['a'],
      spec: { type: 'full_attention', blockSize: 2, numKvHeads: 1, headSize: 2, dtype: 'bf16', kvQuantMode: 'none' },
    },
    {
      groupId: 1,
      layerNames: ['c'],
      spec: { type: 'compressor', blockSize: 4, stateDim: 1, dtype: 'f32', kvQuantMode: 'none' },
    },
  ];
  return [
    { name: 'dsv4', groups: presetKVGroups('dsv4-micro', 2) },
    { name: 'llama', groups: presetKVGroups('llama-micro', 2) },
    { name: 'mixed-bs', groups: mixed },
  ];
}

type Op =
  | { op: 'start'; r: number; tpl: number; len: number; useHit: boolean; ext: number; look: number }
  | { op: 'decode'; r: number }
  | { op: 'free'; r: number }
  | { op: 'uncache'; r: number; start: number }
  | { op: 'reset' }
  | { op: 'detach'; r: number }
  | { op: 'release' }
  | { op: 'land'; r: number };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    arbitrary: fc.record({
      op: fc.constant('start' as const),
      r: fc.nat(3),
      tpl: fc.nat(2),
      len: fc.integer({ min: 1, max: 14 }),
      useHit: fc.boolean(),
      ext: fc.oneof({ arbitrary: fc.constant(0), weight: 3 }, { arbitrary: fc.nat(6), weight: 1 }),
      look: fc.nat(3),
    }),
    weight: 4,
  },
  { arbitrary: fc.record({ op: fc.constant('decode' as const), r: fc.nat(3) }), weight: 3 },
  { arbitrary: fc.record({ op: fc.constant('free' as const), r: fc.nat(3) }), weight: 2 },
  {
    arbitrary: fc.record({ op: fc.constant('uncache' as const), r: fc.nat(3), start: fc.nat(14) }),
    weight: 2,
  },
  fc.record({ op: fc.constant('reset' as const) }),
  fc.record({ op: fc.constant('detach' as const), r: fc.nat(3) }),
  fc.record({ op: fc.constant('release' as const) }),
  fc.record({ op: fc.constant('land' as const), r: fc.nat(3) }),
);

test('property: hits, KV events and chains stay consistent under withdrawals of failed prefixes', () => {
  fc.assert(
    fc.property(
      fc.constantFrom(...configs()),
      fc.integer({ min: 3, max: 20 }),
      fc.array(opArb, { minLength: 5, maxLength: 50 }),
      (cfg, numBlocks, ops) => {
        const config = makeKVCacheConfig(cfg.groups, numBlocks);
        const m = new KVCacheManager(config, { enableCaching: true });
        const events: KvCacheEvent[] = [];
        const pub = m.publishKvEvents({ epoch: 'e', wallMs: () => 0 });
        pub.subscribe((b) => events.push(...b.events));
        const bs = config.groups.map((g) => g.spec.blockSize);
        // `${g}:${page}` -> the tokens its KV holds, and the writes (versions) that KV was computed over.
        const content = new Map<string, { tokens: string; ver: number; over: number[] }>();
        const invalid = new Set<number>(); // versions whose KV is garbage (a failed forward)
        let ver = 0;
        const valid = (key: string): boolean => {
          const c = content.get(key);
          return c !== undefined && !invalid.has(c.ver) && c.over.every((v) => !invalid.has(v));
        };
        const reqs = new Map<string, { tokens: number[]; computed: number; hit: number; loading: boolean }>();
        const set = new Set<string>();
        const parentOf = new Map<string, string | null>();
        let tok = 100;
        const fence: number[][][] = [];
        const write = (id: string, from: number, to: number) => {
          const r = reqs.get(id)!;
          m.getBlockIds(id).forEach((ids, g) => {
            const b = bs[g]!;
            for (let i = Math.floor(from / b); i * b < to; i++) {
              const over = ids.slice(0, i).map((p) => content.get(`${g}:${p}`)?.ver ?? -1);
              const tokens = JSON.stringify(r.tokens.slice(i * b, Math.min((i + 1) * b, to)));
              content.set(`${g}:${ids[i]}`, { tokens, ver: ver++, over });
            }
          });
        };
        for (const o of ops) {
          if (o.op === 'start') {
            const id = `r${o.r}`;
            if (reqs.has(id)) continue;
            const tokens = Array.from({ length: o.len }, (_, i) => o.tpl * 10 + (i % 3));
            const hit = o.useHit
              ? m.getComputedBlocks({ requestId: id, tokenIds: tokens })
              : { blocks: config.groups.map(() => []), numComputedTokens: 0 };
            hit.blocks.forEach((ids, g) =>
              ids.forEach((p, i) =>
                assert.equal(
                  valid(`${g}:${p}`) ? content.get(`${g}:${p}`)?.tokens : 'garbage KV',
                  JSON.stringify(tokens.slice(i * bs[g]!, (i + 1) * bs[g]!)),
                  `hit page ${p} of group ${g} holds other tokens`,
                ),
              ),
            );
            const ext = Math.min(o.ext, o.len - 1 - hit.numComputedTokens);
            const ok = m.allocateSlots({ requestId: id, tokenIds: tokens }, o.len - hit.numComputedTokens - ext, {
              numNewComputedTokens: hit.numComputedTokens,
              newComputedBlocks: hit.blocks,
              numExternalComputedTokens: ext,
              numLookaheadTokens: o.look,
              delayCacheBlocks: ext > 0,
            });
            if (ok === null) continue;
            reqs.set(id, { tokens, computed: o.len, hit: hit.numComputedTokens, loading: ext > 0 });
            write(id, hit.numComputedTokens, o.len);
          } else if (o.op === 'decode') {
            const id = `r${o.r}`;
            const r = reqs.get(id);
            if (!r || r.loading) continue;
            r.tokens.push(tok++);
            const ok = m.allocateSlots({ requestId: id, tokenIds: r.tokens, numComputedTokens: r.computed }, 1);
            if (ok === null) {
              r.tokens.pop();
              continue;
            }
            write(id, r.computed, r.computed + 1);
            r.computed++;
          } else if (o.op === 'detach') {
            if (reqs.has(`r${o.r}`)) fence.push(m.detach(`r${o.r}`));
            reqs.delete(`r${o.r}`);
          } else if (o.op === 'release') {
            const f = fence.shift();
            if (f) m.freeBlockIds(f);
          } else if (o.op === 'land') {
            const r = reqs.get(`r${o.r}`);
            if (r?.loading)
              (m.cacheBlocks({ requestId: `r${o.r}`, tokenIds: r.tokens }, r.computed), (r.loading = false));
          } else if (o.op === 'free') {
            m.free(`r${o.r}`);
            reqs.delete(`r${o.r}`);
          } else if (o.op === 'uncache') {
            const id = `r${o.r}`;
            const r = reqs.get(id);
            if (!r) continue;
            const start = Math.max(r.hit, Math.min(o.start, r.computed));
            // The forward computing [start, ...) failed: those pages hold garbage.
            m.getBlockIds(id).forEach((ids, g) =>
              ids.slice(Math.floor(start / bs[g]!)).forEach((p) => invalid.add(content.get(`${g}:${p}`)?.ver ?? -1)),
            );
            const holders = m.uncacheFrom(id, start);
            for (let i = 0; i < holders.length; i++) {
              const h = holders[i]!;
              for (const more of m.uncacheFrom(h, reqs.get(h)!.hit)) if (!holders.includes(more)) holders.push(more);
            }
            for (const h of [id, ...holders]) {
              m.free(h);
              reqs.delete(h);
            }
          } else {
            m.resetPrefixCache();
          }
          pub.flush();
          for (const e of events.splice(0)) {
            if (e.type === 'AllBlocksCleared') set.clear();
            else if (e.type === 'BlockRemoved')
              for (const h of e.block_hashes) {
                assert.ok(set.has(h), 'removed without stored');
                set.delete(h);
              }
            else {
              let parent = e.parent_block_hash;
              if (parent !== null) assert.ok(set.has(parent), 'stored whose parent is not cached');
              for (const h of e.block_hashes) {
                assert.ok(!set.has(h), 'stored twice');
                set.add(h);
                parentOf.set(h, parent);
                parent = h;
              }
            }
          }
          m.blockPool.verify();
          const held = new Set([...[...reqs.keys()].flatMap((id) => m.getBlockIds(id).flat()), ...fence.flat(2)]);
          assert.equal(m.getNumFreeBlocks(), numBlocks - 1 - held.size, 'free count');
          assert.deepEqual(new Set(m.blockPool.cachedHashes()), set, 'events replay == pool');
          for (const h of set) {
            const p = parentOf.get(h);
            if (p) assert.ok(set.has(p), 'child cached without its parent');
          }
        }
      },
    ),
    { numRuns: 8000 },
  );
});
