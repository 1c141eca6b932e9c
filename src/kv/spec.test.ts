/** Proves page sizes, padding and the zeroing rule for the three presets (yes, yes, no). */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MODEL_PRESETS, presetKVGroups } from './presets.ts';
import {
  attentionSlabs,
  makeKVCacheConfig,
  pageBytes,
  realPageBytes,
  tokenBytes,
  type KVCacheGroupSpec,
} from './spec.ts';

test('needsKvCacheZeroing: dsv4-mini yes (mixed precision), hybrid-mini yes (Mamba), llama-mini no', () => {
  const got = Object.fromEntries(MODEL_PRESETS.map((p) => [p, makeKVCacheConfig(presetKVGroups(p), 8)]));
  assert.equal(got['dsv4-mini']?.needsKvCacheZeroing, true);
  assert.equal(got['dsv4-mini']?.hasMambaLayers, false);
  assert.equal(got['dsv4-mini']?.hasMixedPrecisionKvCache, true);
  assert.equal(got['hybrid-mini']?.needsKvCacheZeroing, true);
  assert.equal(got['hybrid-mini']?.hasMambaLayers, true);
  assert.equal(got['hybrid-mini']?.hasMixedPrecisionKvCache, false);
  assert.equal(got['llama-mini']?.needsKvCacheZeroing, false);
});

test('page sizes: fp8 MLA token = latent + 2*rope + 4*scales; groups padded to one common page', () => {
  const [mla, comp] = presetKVGroups('dsv4-mini');
  assert.ok(mla && comp && mla.spec.type === 'mla' && comp.spec.type === 'compressor');
  assert.equal(tokenBytes(mla.spec), 56 + 16 + 8);
  assert.equal(realPageBytes(mla.spec), 16 * 80);
  const cfg = makeKVCacheConfig(presetKVGroups('hybrid-mini'), 8);
  assert.equal(cfg.pageBytes, Math.max(...presetKVGroups('hybrid-mini').map((g) => realPageBytes(g.spec))));
  for (const g of cfg.groups) assert.equal(pageBytes(g.spec), cfg.pageBytes);
  assert.deepEqual(attentionSlabs(cfg), [0, 1]);
});

test('two attention specs of the same precision are not mixed precision', () => {
  const spec = {
    type: 'full_attention',
    blockSize: 16,
    numKvHeads: 1,
    headSize: 8,
    dtype: 'bf16',
    kvQuantMode: 'none',
  } as const;
  const groups: KVCacheGroupSpec[] = [
    { groupId: 0, layerNames: ['a'], spec },
    { groupId: 1, layerNames: ['b'], spec: { ...spec, numKvHeads: 2 } },
  ];
  assert.equal(makeKVCacheConfig(groups, 4).needsKvCacheZeroing, false);
  assert.throws(() => makeKVCacheConfig(groups, 1), /numBlocks/);
});
