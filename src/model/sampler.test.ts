/**
 * Proves the sampler's contract: greedy = argmax with lowest index on ties; NaN logits are flagged and
 * resolved deterministically; seeded sampling depends only on (seed, outputIndex), respects top-k and
 * top-p, and follows the softmax distribution; logitsHash is bit-exact. top-k and top-p are pinned at
 * their exact boundaries and against a sort-everything reference of the filtering spec, also on large flat
 * vocabularies (where the sampler selects and sorts only part of the vocabulary).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { SeededRng } from '../util/env.ts';
import type { SamplingParams } from './types.ts';
import { argmax, drawSeed, keptWeights, kthLargest, logitsHash, sampleToken } from './sampler.ts';

const f32 = (xs: number[]): Float32Array => Float32Array.from(xs);
const logitsArb = fc
  .array(fc.float({ min: Math.fround(-20), max: Math.fround(20), noNaN: true }), { minLength: 1, maxLength: 64 })
  .map(f32);

test('greedy: argmax, lowest index on ties; logprob is the log-softmax of the raw logits', () => {
  const out = sampleToken(f32([1, 3, 3, 2]), { temperature: 0, seed: 0, outputIndex: 0 });
  assert.equal(out.tokenId, 1);
  assert.equal(out.nanLogits, false);
  const lse = Math.log(Math.exp(1) + 2 * Math.exp(3) + Math.exp(2));
  assert.ok(Math.abs((out.logprob as number) - (3 - lse)) < 1e-12);
});

test('NaN logits: flagged, token = argmax treating NaN as -Infinity at any temperature, 0 if all NaN', () => {
  for (const temperature of [0, 0.7, 2]) {
    const out = sampleToken(f32([1, NaN, 5, 5, NaN]), { temperature, seed: 1, outputIndex: 3 });
    assert.deepEqual(out, { tokenId: 2, logprob: null, nanLogits: true });
    assert.deepEqual(sampleToken(f32([NaN, NaN]), { temperature, seed: 1, outputIndex: 3 }), {
      tokenId: 0,
      logprob: null,
      nanLogits: true,
    });
  }
  assert.equal(argmax(f32([-Infinity, -Infinity])), 0);
  assert.deepEqual(sampleToken(f32([1, Infinity, 2]), { temperature: 0.5, seed: 1, outputIndex: 0 }), {
    tokenId: 1,
    logprob: null,
    nanLogits: false,
  });
});

test('seeded sampling is a function of (logits, params) only; top-k 1 and a tiny top-p are greedy', () => {
  fc.assert(
    fc.property(
      logitsArb,
      fc.integer({ min: 0, max: 2 ** 31 }),
      fc.nat(1000),
      fc.float({ min: Math.fround(0.1), max: 3, noNaN: true }),
      (logits, seed, outputIndex, temperature) => {
        const p = { temperature, seed, outputIndex };
        assert.deepEqual(sampleToken(logits, p), sampleToken(logits.slice(), p));
        assert.equal(sampleToken(logits, { ...p, topK: 1 }).tokenId, argmax(logits));
        assert.equal(sampleToken(logits, { ...p, topP: 1e-9 }).tokenId, argmax(logits));
      },
    ),
  );
});

test('top-k and top-p: the sampled token is always inside the kept set', () => {
  fc.assert(
    fc.property(
      logitsArb,
      fc.integer({ min: 1, max: 10 }),
      fc.double({ min: 0.05, max: 1, noNaN: true }),
      fc.nat(),
      (logits, topK, topP, seed) => {
        const t = sampleToken(logits, { temperature: 1, topK, seed, outputIndex: 0 }).tokenId;
        const chosen = logits[t] as number;
        assert.ok(logits.filter((v) => v > chosen).length < topK, 'fewer than k logits beat the sampled one');
        const u = sampleToken(logits, { temperature: 1, topP, seed, outputIndex: 0 }).tokenId;
        const max = Math.max(...logits);
        const probs = [...logits].map((v) => Math.exp(v - max));
        const z = probs.reduce((a, b) => a + b, 0);
        const massAbove = probs
          .filter((pv, i) => (logits[i] as number) > (logits[u] as number))
          .reduce((a, b) => a + b / z, 0);
        assert.ok(massAbove < topP + 1e-12, 'the mass ranked above the sampled token is below top-p');
      },
    ),
  );
});

test('sampling follows softmax(logits / T): frequencies over 6000 seeded draws', () => {
  const logits = f32([0, Math.log(2), Math.log(3), -Infinity]);
  const counts = [0, 0, 0, 0];
  for (let i = 0; i < 6000; i++) {
    const t = sampleToken(logits, { temperature: 1, seed: 42, outputIndex: i }).tokenId;
    counts[t] = (counts[t] ?? 0) + 1;
  }
  assert.equal(counts[3], 0);
  [1000, 2000, 3000].forEach((want, i) =>
    assert.ok(Math.abs((counts[i] as number) - want) < 150, `token ${i}: ${counts[i]} vs ${want}`),
  );
  // Temperature 0.5 squares the odds: 1 : 4 : 9.
  const sharp = [0, 0, 0];
  for (let i = 0; i < 7000; i++) {
    const t = sampleToken(logits, { temperature: 0.5, seed: 7, outputIndex: i }).tokenId;
    sharp[t] = (sharp[t] ?? 0) + 1;
  }
  [500, 2000, 4500].forEach((want, i) =>
    assert.ok(Math.abs((sharp[i] as number) - want) < 200, `T=0.5 token ${i}: ${sharp[i]} vs ${want}`),
  );
});

test('different seeds or output indices draw differently', () => {
  const logits = new Float32Array(1000); // uniform over 1000 tokens
  const bySeed = new Set(
    Array.from({ length: 50 }, (_, s) => sampleToken(logits, { temperature: 1, seed: s, outputIndex: 0 }).tokenId),
  );
  const byIndex = new Set(
    Array.from({ length: 50 }, (_, i) => sampleToken(logits, { temperature: 1, seed: 1, outputIndex: i }).tokenId),
  );
  assert.ok(bySeed.size > 30 && byIndex.size > 30);
});

test('logitsHash: equal bytes hash equal; one flipped bit (even 0 vs -0) hashes differently', () => {
  const a = f32([1.5, -2, 0, 3]);
  assert.equal(logitsHash(a), logitsHash(a.slice()));
  assert.match(logitsHash(a), /^[0-9a-f]{32}$/);
  assert.notEqual(logitsHash(a), logitsHash(f32([1.5, -2, -0, 3])));
  const b = a.slice();
  const bytes = new Uint8Array(b.buffer);
  bytes[5] = (bytes[5] as number) ^ 1;
  assert.notEqual(logitsHash(a), logitsHash(b));
  assert.equal(
    logitsHash(new Float32Array(a.buffer, 4, 2)),
    logitsHash(f32([-2, 0])),
    'a view hashes only its own bytes',
  );
});

/** The distinct tokens drawn over `n` seeds (outputIndex 0). */
function drawn(logits: Float32Array, p: Omit<SamplingParams, 'seed' | 'outputIndex'>, n = 500): number[] {
  const seen = new Set<number>();
  for (let seed = 0; seed < n; seed++) seen.add(sampleToken(logits, { ...p, seed, outputIndex: 0 }).tokenId);
  return [...seen].sort((a, b) => a - b);
}

test('top-p boundary: logits [0,0] with top_p 0.5 always give token 0 (the first tied token alone reaches half the mass); just above 0.5 both are kept', () => {
  assert.deepEqual(drawn(f32([0, 0]), { temperature: 1, topP: 0.5 }), [0]);
  assert.deepEqual(drawn(f32([0, 0]), { temperature: 1, topP: 0.5 + 1e-9 }), [0, 1]);
  assert.deepEqual(
    drawn(f32([0, 0, 0, 0]), { temperature: 1, topP: 0.5 }),
    [0, 1],
    'two of four equal tokens reach exactly 0.5',
  );
  assert.deepEqual(drawn(f32([0, 0, 0, 0]), { temperature: 1, topP: 0.75 }), [0, 1, 2]);
  assert.deepEqual(drawn(f32([0, 0, 0, 0]), { temperature: 1, topP: 1 }), [0, 1, 2, 3]);
});

test('top-k boundary: top_k = k keeps exactly the k largest logits, ties to the lower index; k >= vocabulary or k = 0 keeps all', () => {
  const flat = f32([0, 0, 0, 0]);
  assert.deepEqual(drawn(flat, { temperature: 1, topK: 2 }), [0, 1]);
  assert.deepEqual(drawn(flat, { temperature: 1, topK: 3 }), [0, 1, 2]);
  // Temperature 3 flattens the odds so every kept token shows up in 500 draws.
  const desc = f32([1, 5, 3, 4, 2]);
  assert.deepEqual(drawn(desc, { temperature: 3, topK: 2 }), [1, 3]);
  assert.deepEqual(drawn(desc, { temperature: 3, topK: 3 }), [1, 2, 3]);
  assert.deepEqual(drawn(desc, { temperature: 3, topK: 4 }), [1, 2, 3, 4]);
  assert.deepEqual(
    drawn(f32([2, 1, 1, 1, 0]), { temperature: 3, topK: 3 }),
    [0, 1, 2],
    'the tie at the cut goes to the lower index',
  );
  for (const topK of [5, 6, 0])
    assert.deepEqual(drawn(desc, { temperature: 3, topK }), [0, 1, 2, 3, 4], `top_k ${topK}`);
});

/**
 * The filtering spec, written plainly (sort the whole vocabulary; the sampler avoids that): weights
 * w = exp((l - max) / T); rank tokens by (logit desc, index asc); top-k keeps the first k; top-p keeps
 * the shortest prefix of the rest whose weight reaches topP x total (everything if rounding leaves the
 * sum short); then the one draw u of (seed, outputIndex) picks the first token, in index order, whose
 * running kept weight exceeds u x kept total.
 */
function referenceSample(logits: Float32Array, p: SamplingParams): { kept: number[]; tokenId: number } {
  const max = Math.max(...logits);
  const w = Array.from(logits, (l) => Math.exp((l - max) / p.temperature));
  const order = [...logits.keys()].sort((a, b) => (logits[b] as number) - (logits[a] as number) || a - b);
  let kept = order.filter((i) => (w[i] as number) > 0);
  if (p.topK !== undefined && p.topK > 0) kept = kept.slice(0, p.topK);
  const weightIn = (set: number[]): number => w.reduce((s, x, i) => (set.includes(i) ? s + x : s), 0);
  if (p.topP !== undefined && p.topP < 1) {
    const target = p.topP * weightIn(kept);
    let cum = 0;
    const len = kept.findIndex((i) => (cum += w[i] as number) >= target);
    if (len >= 0) kept = kept.slice(0, len + 1);
  }
  const total = weightIn(kept);
  const target = new SeededRng(drawSeed(p.seed, p.outputIndex)).next() * total;
  let acc = 0;
  let tokenId = -1;
  for (let i = 0; i < w.length; i++) {
    if (!kept.includes(i)) continue;
    acc += w[i] as number;
    tokenId = i;
    if (acc > target) break;
  }
  return { kept, tokenId };
}

test('top-p property: the kept set is the shortest prefix, by probability desc then index, whose mass reaches top_p (after top-k); each draw matches the reference', () => {
  // Small integer alphabets make ties and exact boundaries common; `atPrefix` puts top_p exactly on a prefix's mass.
  const logits = fc.oneof(
    logitsArb,
    fc.array(fc.constantFrom(0, 0, 1, -1, 2), { minLength: 1, maxLength: 12 }).map(f32),
  );
  const topPSpec = fc.oneof(
    fc.record({ free: fc.double({ min: 0.01, max: 1, noNaN: true }) }),
    fc.record({ atPrefix: fc.nat(12) }),
  );
  let boundaryCases = 0;
  fc.assert(
    fc.property(
      logits,
      fc.oneof(fc.constant(1), fc.float({ min: Math.fround(0.1), max: 3, noNaN: true })),
      fc.option(fc.integer({ min: 0, max: 12 }), { nil: undefined }),
      topPSpec,
      fc.nat(),
      (xs, temperature, topK, spec, seed) => {
        let topP: number;
        if ('free' in spec) topP = spec.free;
        else {
          // The mass of the first m+1 ranked tokens that top-k keeps, as a fraction: top_p sits on a boundary.
          const { kept } = referenceSample(xs, { temperature, topK, seed: 0, outputIndex: 0 });
          const max = Math.max(...xs);
          const wt = (i: number): number => Math.exp(((xs[i] as number) - max) / temperature);
          const total = kept.reduce((s, i) => s + wt(i), 0);
          const prefix = kept.slice(0, Math.min(spec.atPrefix, kept.length - 1) + 1).reduce((s, i) => s + wt(i), 0);
          topP = Math.min(1, prefix / total);
          boundaryCases++;
        }
        for (let outputIndex = 0; outputIndex < 8; outputIndex++) {
          const p: SamplingParams = { temperature, topK, topP, seed, outputIndex };
          const want = referenceSample(xs, p);
          const got = sampleToken(xs, p).tokenId;
          assert.ok(want.kept.includes(got), `token ${got} outside the kept set ${want.kept.join(',')}`);
          assert.equal(got, want.tokenId, `draw ${outputIndex}: kept set ${want.kept.join(',')}`);
        }
      },
    ),
    { numRuns: 400 },
  );
  assert.ok(boundaryCases > 50, 'the generator reaches exact top_p boundaries');
});

test('kthLargest: the k-th value of a descending sort, ties and all', () => {
  fc.assert(
    fc.property(fc.array(fc.integer({ min: -5, max: 5 }), { minLength: 1, maxLength: 200 }), fc.nat(), (xs, r) => {
      const k = 1 + (r % xs.length);
      const sorted = [...xs].sort((a, b) => b - a);
      assert.equal(kthLargest(Float32Array.from(xs), k), sorted[k - 1]);
    }),
    { numRuns: 300 },
  );
});

test('large flat vocabularies (hundreds of near-equal logits, many ties): top-k and top-p keep the reference set and draw as it', () => {
  // Logits within 1 of each other: top-p sets span several of the sampler's candidate sets, top-k many ties.
  const flat = fc
    .array(fc.integer({ min: -16, max: 16 }), { minLength: 100, maxLength: 400 })
    .map((xs) => f32(xs.map((x) => x / 32)));
  fc.assert(
    fc.property(
      flat,
      fc.option(fc.integer({ min: 1, max: 420 }), { nil: undefined }),
      fc.option(fc.double({ min: 0.01, max: 1, noNaN: true }), { nil: undefined }),
      fc.nat(),
      (xs, topK, topP, seed) => {
        const kept = keptWeights(xs, { temperature: 0.7, topK, topP, seed, outputIndex: 0 }, Math.max(...xs));
        const want = referenceSample(xs, { temperature: 0.7, topK, topP, seed, outputIndex: 0 }).kept;
        assert.deepEqual(
          [...kept.keys()].filter((i) => (kept[i] as number) > 0),
          [...want].sort((a, b) => a - b),
          'the kept set',
        );
        for (let outputIndex = 0; outputIndex < 4; outputIndex++) {
          const p: SamplingParams = { temperature: 0.7, topK, topP, seed, outputIndex };
          assert.equal(sampleToken(xs, p).tokenId, referenceSample(xs, p).tokenId, `draw ${outputIndex}`);
        }
      },
    ),
    { numRuns: 60 },
  );
});
