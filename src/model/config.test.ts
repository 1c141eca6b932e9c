/**
 * Proves the model's layers are derived from the preset's KV groups (kind, group, slab), that a
 * config that does not match its preset is refused, and that weights are a pure function of
 * (seed, tensor name).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isHandoffError } from '../util/errors.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { modelConfig, type LayerPlan } from './config.ts';
import { buildWeights } from './weights.ts';
import { kvConfigFor } from './fixtures.ts';

const where = (l: LayerPlan): string =>
  l.kind === 'mla'
    ? `mla g${l.cache.group}s${l.cache.slab}+comp g${l.compressor.group}s${l.compressor.slab}`
    : `${l.kind} g${l.cache.group}s${l.cache.slab}`;

test('layers follow the KV groups: dsv4 MLA+compressor, hybrid attention/Mamba alternating, llama GQA', () => {
  assert.deepEqual(modelConfig('dsv4-mini', kvConfigFor('dsv4-mini')).layers.map(where), [
    'mla g0s0+comp g1s0',
    'mla g0s1+comp g1s1',
  ]);
  assert.deepEqual(modelConfig('hybrid-mini', kvConfigFor('hybrid-mini')).layers.map(where), [
    'gqa g0s0',
    'mamba g1s0',
    'gqa g0s1',
    'mamba g1s1',
  ]);
  assert.deepEqual(modelConfig('llama-mini', kvConfigFor('llama-mini')).layers.map(where), ['gqa g0s0', 'gqa g0s1']);
});

test("a KV config that is not the preset's is refused with BAD_CONFIG", () => {
  const wrong = [
    kvConfigFor('llama-mini'),
    makeKVCacheConfig(
      presetKVGroups('dsv4-mini').map((g) =>
        g.groupId === 1 ? { ...g, spec: { ...g.spec, stateDim: 24 } } : g,
      ) as never,
      8,
    ),
  ];
  for (const kv of wrong) {
    assert.throws(
      () => modelConfig('dsv4-mini', kv),
      (e: unknown) => isHandoffError(e) && e.code === 'BAD_CONFIG',
    );
  }
});

test('weights: same seed -> identical bytes; another seed -> different; a tensor depends on its name, not on the others', () => {
  const cfg = modelConfig('dsv4-mini', kvConfigFor('dsv4-mini'));
  const a = buildWeights(cfg, 5);
  const b = buildWeights(cfg, 5);
  const c = buildWeights(cfg, 6);
  assert.deepEqual(a.layers, b.layers);
  assert.deepEqual(a.embed.w, b.embed.w);
  assert.notDeepEqual(a.embed.w.subarray(0, 64), c.embed.w.subarray(0, 64));
  assert.notDeepEqual(a.lmHead.w.subarray(0, 64), a.embed.w.subarray(0, 64), 'the lm head is not tied');
  const llama = buildWeights(modelConfig('llama-mini', kvConfigFor('llama-mini')), 5);
  assert.deepEqual(llama.embed.w.subarray(0, 4096), a.embed.w.subarray(0, 4096));
  assert.deepEqual(llama.layers[0]?.mlp, a.layers[0]?.mlp);
});
