/**
 * Proves the sampler's contract: greedy = argmax with lowest index on ties; NaN logits are flagged and
 * resolved deterministically; seeded sampling depends only on (seed, outputIndex), respects top-k and
 * top-p, and follows the softmax distribution; logitsHash is bit-exact.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { argmax, logitsHash, sampleToken } from './sampler.ts';

const f32 = (xs: number[]): Float32Array => Float32Array.from(xs);
const logitsArb = fc.array(fc.float({ min: Math.fround(-20), max: Math.fround(20), noNaN: true }), { minLength: 1, maxLength: 64 }).map(f32);

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
    assert.deepEqual(sampleToken(f32([NaN, NaN]), { temperature, seed: 1, outputIndex: 3 }), { tokenId: 0, logprob: null, nanLogits: true });
  }
  assert.equal(argmax(f32([-Infinity, -Infinity])), 0);
  assert.deepEqual(sampleToken(f32([1, Infinity, 2]), { temperature: 0.5, seed: 1, outputIndex: 0 }), { tokenId: 1, logprob: null, nanLogits: false });
});

test('seeded sampling is a function of (logits, params) only; top-k 1 and a tiny top-p are greedy', () => {
  fc.assert(
    fc.property(logitsArb, fc.integer({ min: 0, max: 2 ** 31 }), fc.nat(1000), fc.float({ min: Math.fround(0.1), max: 3, noNaN: true }), (logits, seed, outputIndex, temperature) => {
      const p = { temperature, seed, outputIndex };
      assert.deepEqual(sampleToken(logits, p), sampleToken(logits.slice(), p));
      assert.equal(sampleToken(logits, { ...p, topK: 1 }).tokenId, argmax(logits));
      assert.equal(sampleToken(logits, { ...p, topP: 1e-9 }).tokenId, argmax(logits));
    }),
  );
});

test('top-k and top-p: the sampled token is always inside the kept set', () => {
  fc.assert(
    fc.property(logitsArb, fc.integer({ min: 1, max: 10 }), fc.double({ min: 0.05, max: 1, noNaN: true }), fc.nat(), (logits, topK, topP, seed) => {
      const t = sampleToken(logits, { temperature: 1, topK, seed, outputIndex: 0 }).tokenId;
      const chosen = logits[t] as number;
      assert.ok(logits.filter((v) => v > chosen).length < topK, 'fewer than k logits beat the sampled one');
      const u = sampleToken(logits, { temperature: 1, topP, seed, outputIndex: 0 }).tokenId;
      const max = Math.max(...logits);
      const probs = [...logits].map((v) => Math.exp(v - max));
      const z = probs.reduce((a, b) => a + b, 0);
      const massAbove = probs.filter((pv, i) => (logits[i] as number) > (logits[u] as number)).reduce((a, b) => a + b / z, 0);
      assert.ok(massAbove < topP + 1e-12, 'the mass ranked above the sampled token is below top-p');
    }),
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
  [1000, 2000, 3000].forEach((want, i) => assert.ok(Math.abs((counts[i] as number) - want) < 150, `token ${i}: ${counts[i]} vs ${want}`));
  // Temperature 0.5 squares the odds: 1 : 4 : 9.
  const sharp = [0, 0, 0];
  for (let i = 0; i < 7000; i++) {
    const t = sampleToken(logits, { temperature: 0.5, seed: 7, outputIndex: i }).tokenId;
    sharp[t] = (sharp[t] ?? 0) + 1;
  }
  [500, 2000, 4500].forEach((want, i) => assert.ok(Math.abs((sharp[i] as number) - want) < 200, `T=0.5 token ${i}: ${sharp[i]} vs ${want}`));
});

test('different seeds or output indices draw differently', () => {
  const logits = new Float32Array(1000); // uniform over 1000 tokens
  const bySeed = new Set(Array.from({ length: 50 }, (_, s) => sampleToken(logits, { temperature: 1, seed: s, outputIndex: 0 }).tokenId));
  const byIndex = new Set(Array.from({ length: 50 }, (_, i) => sampleToken(logits, { temperature: 1, seed: 1, outputIndex: i }).tokenId));
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
  assert.equal(logitsHash(new Float32Array(a.buffer, 4, 2)), logitsHash(f32([-2, 0])), 'a view hashes only its own bytes');
});
