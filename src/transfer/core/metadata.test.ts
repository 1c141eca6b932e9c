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

test('with page formats: other block sizes and page sizes are compatible when every token group can be mapped', () => {
  const meta = (id: string, preset: string, bs: number) =>
    buildMetadata({
      engineId: id,
      modelName: 'm',
      preset,
      ...layoutFromKvConfig(makeKVCacheConfig(presetKVGroups(preset as 'dsv4-mini', bs), 8)),
    });
  for (const preset of ['dsv4-mini', 'hybrid-mini', 'llama-mini'])
    for (const p of [1, 8, 16, 32, 256])
      for (const d of [8, 16, 32]) {
        assert.equal(compatibilityProblem(meta('a', preset, d), meta('b', preset, p)), null, `${preset} ${p}/${d}`);
        assert.equal(compatibilityProblem(meta('b', preset, p), meta('a', preset, d)), null, `${preset} ${d}/${p}`);
      }
  assert.match(compatibilityProblem(meta('a', 'dsv4-mini', 16), meta('b', 'llama-mini', 16)) ?? '', /preset/);
});

test('with page formats: sizes that cannot be mapped, formats that differ and pages too small are refused by name', () => {
  const formats = [{ kind: 'tokens' as const, regionTokenBytes: [80] }];
  const at = (id: string, bs: number, pageBytes = bs * 80, f = formats) =>
    buildMetadata({ ...base, engineId: id, layout: { ...base.layout, pageBytes }, blockSizes: [bs], pageFormats: f });
  assert.equal(compatibilityProblem(at('a', 16), at('b', 64)), null);
  assert.match(
    compatibilityProblem(at('a', 16), at('b', 24)) ?? '',
    /blockSizes \[24\] and \[16\] cannot be mapped: group 0 has pages of 24 and 16 tokens, and one must be a multiple of the other/,
  );
  assert.match(
    compatibilityProblem(at('a', 16), at('b', 32, 1280)) ?? '',
    /32 tokens need 2560 bytes, more than a page of 1280/,
  );
  const other = [{ kind: 'tokens' as const, regionTokenBytes: [40, 40] }];
  assert.match(compatibilityProblem(at('a', 16), at('b', 16, 1280, other)) ?? '', /page formats differ/);
  // A bare peer (no formats) still needs the same page size and block sizes.
  const bare = buildMetadata({ ...base, engineId: 'c', layout: { ...base.layout, pageBytes: 2560 }, blockSizes: [32] });
  assert.match(compatibilityProblem(at('a', 16), bare) ?? '', /pageBytes 2560 != 1280; blockSizes \[32\] != \[16\]/);
});

test('different tensor parallel sizes: engines of every preset at TP 1 and 2 accept each other at any block sizes', () => {
  const meta = (id: string, preset: string, tp: number, bs: number) =>
    buildMetadata({
      engineId: id,
      modelName: 'm',
      preset,
      ...layoutFromKvConfig(makeKVCacheConfig(presetKVGroups(preset as 'dsv4-mini', bs), 8, tp)),
    });
  for (const preset of ['dsv4-mini', 'hybrid-mini', 'llama-mini', 'hybrid-micro'])
    for (const [p, d] of [
      [2, 1],
      [1, 2],
      [2, 2],
    ])
      for (const [pb, db] of [
        [8, 32],
        [16, 16],
        [32, 8],
      ]) {
        const [a, b] = [meta('a', preset, d!, db!), meta('b', preset, p!, pb!)];
        assert.equal(compatibilityProblem(a, b), null, `${preset} P TP ${p} bs ${pb} / D TP ${d} bs ${db}`);
        assert.equal(compatibilityProblem(b, a), null);
        assert.equal(a.compatHash, b.compatHash, 'the hash covers what every rank shares, not the degree');
      }
  // Another cache is still refused across degrees (the whole specs differ).
  assert.match(
    compatibilityProblem(meta('a', 'llama-mini', 1, 16), meta('b', 'hybrid-mini', 2, 16)) ?? '',
    /split differently/,
  );
  assert.match(
    compatibilityProblem(meta('a', 'llama-mini', 1, 16), meta('b', 'dsv4-mini', 2, 16)) ?? '',
    /split differently/,
  );
});

test('degrees that cannot be mapped are refused naming both degrees and both engines', () => {
  const formats = [{ kind: 'tokens' as const, regionTokenBytes: [32, 32] }];
  const at = (id: string, tp: number, splits?: number[]) =>
    buildMetadata({
      ...base,
      engineId: id,
      layout: { numSlabs: 2 * tp, numBlocks: 8, pageBytes: 1024 / tp, tensorParallelSize: tp },
      blockSizes: [16],
      pageFormats: formats.map((f) => ({ ...f, regionTokenBytes: f.regionTokenBytes.map((b) => b / tp) })),
      ...(splits ? { tpSplits: splits } : {}),
    });
  const one = at('a', 1, [2]);
  assert.equal(compatibilityProblem(one, at('b', 2, [2])), null);
  // A degree that does not divide the heads (what no preset builds: a peer from elsewhere).
  const problem = compatibilityProblem(one, at('c', 4, [2])) ?? 'compatible';
  assert.match(problem, /tensor parallel sizes 4 and 1 cannot be mapped \(peer c runs TP=4, engine a TP=1\)/);
  assert.match(problem, /group 0 splits into 2 .* which 4 slices/);
  assert.match(compatibilityProblem(at('c', 4, [2]), one) ?? '', /tensor parallel sizes 1 and 4/);
  // A peer that does not say how its caches split (a bare engine) is refused at another degree.
  assert.match(compatibilityProblem(one, at('d', 2)) ?? '', /sizes 2 and 1 cannot be mapped.*without page formats/);
  assert.match(compatibilityProblem(one, at('e', 2, [4])) ?? '', /split differently/);
  // Without splits the degree stays part of the hash: equal bare degrees match each other only.
  const bare = (tp: number) =>
    buildMetadata({ ...base, layout: { numSlabs: 2 * tp, numBlocks: 8, pageBytes: 640, tensorParallelSize: tp } });
  assert.equal(compatibilityProblem(bare(2), buildMetadata({ ...base, engineId: 'z', layout: bare(2).layout })), null);
  assert.notEqual(bare(1).compatHash, bare(2).compatHash);
});

test('layoutFromKvConfig carries the tensor parallel size: TP=2 registers every rank’s slabs of half-head pages', () => {
  const l1 = layoutFromKvConfig(makeKVCacheConfig(presetKVGroups('llama-mini'), 8));
  const l2 = layoutFromKvConfig(makeKVCacheConfig(presetKVGroups('llama-mini'), 8, 2));
  assert.deepEqual([l1.layout.tensorParallelSize, l2.layout.tensorParallelSize], [1, 2]);
  assert.deepEqual([l2.layout.numSlabs, l2.layout.pageBytes], [2 * l1.layout.numSlabs, l1.layout.pageBytes / 2]);
});
