/**
 * Proves the handshake compatibility rule: every mismatch that changes what a page means is named; numBlocks may
 * differ.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { presetKVGroups } from '../../kv/presets.ts';
import { makeKVCacheConfig } from '../../kv/spec.ts';
import { buildMetadata, compatibilityProblem, layoutFromKvConfig } from './metadata.ts';

const base = {
  engineId: 'a',
  modelName: 'm',
  preset: 'dsv4-mini',
  layout: { numSlabs: 2, numBlocks: 8, pageBytes: 1280 },
  blockSizes: [16, 16],
};

test('compatible peers: same model, preset, slabs, page size and block sizes; numBlocks may differ', () => {
  const a = buildMetadata(base);
  const b = buildMetadata({ ...base, engineId: 'b', layout: { ...base.layout, numBlocks: 64 } });
  assert.equal(compatibilityProblem(a, b), null);
  assert.equal(compatibilityProblem(b, a), null);
});

test('each incompatibility is refused with a message that names it', () => {
  const a = buildMetadata(base);
  const cases: Array<[Partial<typeof base> & { cacheHash?: string }, RegExp]> = [
    [{ modelName: 'other' }, /model other != m/],
    [{ preset: 'llama-mini' }, /preset llama-mini != dsv4-mini/],
    [{ layout: { ...base.layout, numSlabs: 3 } }, /numSlabs 3 != 2/],
    [{ layout: { ...base.layout, pageBytes: 2048 } }, /pageBytes 2048 != 1280/],
    [{ blockSizes: [16, 32] }, /blockSizes \[16,32\] != \[16,16\]/],
    [{ cacheHash: 'x' }, /compatibility hash/],
    [{ engineId: 'a' }, /same engine id/],
  ];
  for (const [change, re] of cases) {
    const b = buildMetadata({ ...base, engineId: 'b', ...change });
    assert.match(compatibilityProblem(a, b) ?? 'compatible', re);
  }
});

test('layoutFromKvConfig: presets give different cache hashes; the same preset with more blocks is compatible', () => {
  const small = layoutFromKvConfig(makeKVCacheConfig(presetKVGroups('dsv4-mini'), 8));
  const large = layoutFromKvConfig(makeKVCacheConfig(presetKVGroups('dsv4-mini'), 64));
  const llama = layoutFromKvConfig(makeKVCacheConfig(presetKVGroups('llama-mini'), 8));
  assert.equal(small.cacheHash, large.cacheHash);
  assert.notEqual(small.cacheHash, llama.cacheHash);
  const meta = (id: string, l: typeof small) => buildMetadata({ engineId: id, modelName: 'm', preset: 'p', ...l });
  assert.equal(compatibilityProblem(meta('a', small), meta('b', large)), null);
  assert.notEqual(compatibilityProblem(meta('a', small), meta('b', llama)), null);
});

test('different tensor parallel sizes are refused first, naming both degrees and both engines; equal ones pass', () => {
  const one = buildMetadata(base);
  const two = buildMetadata({
    ...base,
    engineId: 'b',
    layout: { numSlabs: 4, numBlocks: 8, pageBytes: 640, tensorParallelSize: 2 },
  });
  const problem = compatibilityProblem(one, two) ?? 'compatible';
  assert.match(problem, /tensor parallel size 2 != 1/);
  assert.match(problem, /peer b runs TP=2, engine a TP=1/);
  assert.match(compatibilityProblem(two, one) ?? 'compatible', /tensor parallel size 1 != 2/);
  const twoAgain = buildMetadata({ ...base, engineId: 'c', layout: { ...two.layout } });
  assert.equal(compatibilityProblem(two, twoAgain), null);
  assert.equal(two.layout.tensorParallelSize, 2);
  assert.equal(one.layout.tensorParallelSize, 1, 'absent means TP=1');
  assert.notEqual(
    one.compatHash,
    buildMetadata({ ...base, layout: { ...base.layout, tensorParallelSize: 2 } }).compatHash,
  );
});

test('layoutFromKvConfig carries the tensor parallel size: TP=2 registers every rank’s slabs of half-head pages', () => {
  const l1 = layoutFromKvConfig(makeKVCacheConfig(presetKVGroups('llama-mini'), 8));
  const l2 = layoutFromKvConfig(makeKVCacheConfig(presetKVGroups('llama-mini'), 8, 2));
  assert.deepEqual([l1.layout.tensorParallelSize, l2.layout.tensorParallelSize], [1, 2]);
  assert.deepEqual([l2.layout.numSlabs, l2.layout.pageBytes], [2 * l1.layout.numSlabs, l1.layout.pageBytes / 2]);
});
