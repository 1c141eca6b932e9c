/**
 * Proves tensor parallelism keeps the model's output bit for bit: for every preset, TP=2 (both ranks in
 * one process, each with its own slabs) gives the same tokens and logits as TP=1, prefill chunked or not;
 * each rank's pages hold exactly the bytes kv/tp_layout.ts says (its heads or channels of the TP=1 page,
 * the MLA latent whole), so a page copied to the same rank elsewhere means the same thing; and the
 * reduction adds shard partials in one order whatever the degree (a property test), an order that matters.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { MODEL_PRESETS, presetKVGroups } from '../kv/presets.ts';
import { rankPageRuns } from '../kv/tp_layout.ts';
import { deviceSlab, type KVCacheConfig } from '../kv/spec.ts';
import { createModel } from './model.ts';
import { vocabSizeOf } from './config.ts';
import { generate, kvConfigFor, makeSlabs, PageCounter, promptTokens } from './fixtures.ts';
import { addReduced, Parallel } from './parallel.ts';
import type { ForwardOutput } from './types.ts';
import type { RankCollective } from '../device/types.ts';

const SEED = 7;
const summary = (outs: ForwardOutput[]): Array<[number | null, string | null, boolean]> =>
  outs.map((o) => [o.tokenId, o.logitsHash, o.nanLogits]);

function run(preset: (typeof MODEL_PRESETS)[number], tp: number, chunks: number[]) {
  const kv = kvConfigFor(preset, 32, tp);
  const slabs = makeSlabs(kv);
  const prompt = promptTokens(
    chunks.reduce((a, b) => a + b, 0),
    3,
    vocabSizeOf(preset),
  );
  const outs = generate(createModel(preset, SEED, kv), slabs, new PageCounter(kv), prompt, STEPS, { chunks });
  return { kv, slabs, outs, tables: tablesOf(kv, chunks) };
}

const STEPS = 5;

/** The block tables generate() built: the same PageCounter growth, replayed. */
function tablesOf(kv: KVCacheConfig, chunks: number[]): number[][] {
  const pages = new PageCounter(kv);
  const tables: number[][] = [];
  let pos = 0;
  for (const n of chunks) pages.cover(tables, (pos += n));
  for (let s = 0; s < STEPS; s++) pages.cover(tables, ++pos);
  return tables;
}

type Run = ReturnType<typeof run>;

/** Every byte of rank r's pages in the tables equals the byte of the TP=1 page tp_layout.ts maps it from. */
function assertRankPagesAreSlices(preset: (typeof MODEL_PRESETS)[number], one: Run, two: Run): void {
  const tp = two.kv.tensorParallelSize;
  presetKVGroups(preset).forEach((g, gi) =>
    g.layerNames.forEach((name, layer) => {
      for (let rank = 0; rank < tp; rank++) {
        const src = one.slabs[deviceSlab(one.kv, 0, layer)] as Uint8Array;
        const dst = two.slabs[deviceSlab(two.kv, rank, layer)] as Uint8Array;
        for (const block of one.tables[gi] ?? [])
          for (const r of rankPageRuns(g.spec, tp, rank)) {
            const at = block * one.kv.pageBytes + r.wholeOffset;
            const to = block * two.kv.pageBytes + r.rankOffset;
            assert.deepEqual(
              dst.subarray(to, to + r.length),
              src.subarray(at, at + r.length),
              `${preset} ${name} rank ${rank} block ${block} at ${r.wholeOffset}`,
            );
          }
      }
    }),
  );
}

for (const preset of MODEL_PRESETS) {
  test(`${preset}: TP=2 gives the tokens and logits of TP=1 bit for bit, one chunk or several, and rank pages are slices of TP=1 pages`, () => {
    for (const chunks of [[29], [16, 3, 10]]) {
      const a = run(preset, 1, chunks);
      const b = run(preset, 2, chunks);
      assert.equal(b.kv.numSlabs, 2 * a.kv.numSlabs);
      assert.ok(a.outs.every((o) => o.tokenId !== null && !o.nanLogits));
      assert.deepEqual(summary(b.outs), summary(a.outs), `chunks ${chunks.join(',')}`);
      assertRankPagesAreSlices(preset, a, b);
    }
  });
}

test('rank pages are what tp_layout.ts says: a corrupted byte of rank 1 is found (the check can fail)', () => {
  const a = run('llama-micro', 1, [20]);
  const b = run('llama-micro', 2, [20]);
  const slab = b.slabs[deviceSlab(b.kv, 1, 0)] as Uint8Array;
  slab[1 * b.kv.pageBytes] = (slab[1 * b.kv.pageBytes] as number) ^ 1;
  assert.throws(() => assertRankPagesAreSlices('llama-micro', a, b), /rank 1 block 1/);
});

/** Two ranks in one thread: rank 0's partials are gathered first, so rank 1's allGather sees both. */
function pairedCollectives(): [RankCollective, RankCollective, (local: Float64Array) => void] {
  let first: Float64Array | null = null;
  const make = (rank: number): RankCollective => ({
    rank,
    size: 2,
    allGather: (local, out) => {
      assert.ok(first !== null, 'rank 0 gathers first in this test');
      out.set(first, 0);
      out.set(local, first.length);
    },
    abort: () => {},
    agree: (failed) => failed,
  });
  return [make(0), make(1), (local) => (first = Float64Array.from(local))];
}

test('all-reduce order: shard partials reduced at TP=1 and gathered from two ranks at TP=2 give the same bits', () => {
  const f64 = fc.double({ noNaN: true, min: -1e6, max: 1e6 });
  fc.assert(
    fc.property(fc.array(fc.tuple(f64, f64, f64), { minLength: 1, maxLength: 24 }), (rows) => {
      const width = rows.length;
      const p0 = Float64Array.from(rows.map((r) => r[1]));
      const p1 = Float64Array.from(rows.map((r) => r[2]));
      const h1 = [Float64Array.from(rows.map((r) => r[0]))];
      const one = new Parallel(1, 1);
      const local = new Float64Array(2 * width);
      local.set(p0, 0);
      local.set(p1, width);
      addReduced(h1, one.gather(local, width), one.shards, width);
      const [c0, c1, publish] = pairedCollectives();
      const r1 = new Parallel(2, 1, { size: 2, ranks: [1], collective: c1 });
      assert.equal(c0.rank, 0);
      publish(p0);
      const h2 = [Float64Array.from(rows.map((r) => r[0]))];
      addReduced(h2, r1.gather(p1, width), r1.shards, width);
      assert.deepEqual(h2, h1);
    }),
  );
  // The order matters: h + (p0 + p1) is not (h + p0) + p1, so a TP-dependent order would change the bits.
  const h = [Float64Array.of(1)];
  addReduced(h, Float64Array.of(1e16, -1e16), 2, 1);
  assert.equal(h[0]?.[0], 1);
  assert.equal(1 + 1e16 - 1e16, 0);
});
