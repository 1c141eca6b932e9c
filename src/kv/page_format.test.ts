/**
 * Proves the per-page byte layouts tile each real page exactly, and tells the NaN story (DESIGN.md §4):
 * a page written by the f32 compressor group, freed and handed to the fp8 MLA group, decodes to NaN
 * in the latent, attention's 0 * value masking keeps the NaN, and zeroing the pages the manager
 * recorded removes it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SeededRng } from '../util/env.ts';
import { decodeFp8E4m3 } from './codecs.ts';
import { KVCacheManager } from './kv_cache_manager.ts';
import { pageRange, slabBytes } from './layout.ts';
import {
  compressorSlotSpan,
  fullAttentionSlotSpans,
  mambaStateSpans,
  mlaSlotSpans,
  type ByteSpan,
} from './page_format.ts';
import { MODEL_PRESETS, presetKVGroups } from './presets.ts';
import { attentionSlabs, makeKVCacheConfig, realPageBytes, type KVCacheSpec, type MLAAttentionSpec } from './spec.ts';

function spansOf(spec: KVCacheSpec): ByteSpan[] {
  const slots = Array.from({ length: spec.blockSize }, (_, t) => t);
  switch (spec.type) {
    case 'mla':
      return slots.flatMap((t) => Object.values(mlaSlotSpans(spec, t)));
    case 'full_attention':
      return slots.flatMap((t) => Object.values(fullAttentionSlotSpans(spec, t)));
    case 'compressor':
      return slots.map((t) => compressorSlotSpan(spec, t));
    case 'mamba':
      return Object.values(mambaStateSpans(spec));
  }
}

test('page formats: the spans of every preset spec cover [0, realPageBytes) with no gap and no overlap', () => {
  for (const preset of MODEL_PRESETS) {
    for (const g of presetKVGroups(preset)) {
      const spans = spansOf(g.spec).sort((a, b) => a.offset - b.offset);
      let at = 0;
      for (const s of spans) {
        assert.equal(s.offset, at, `${preset} group ${g.groupId}: gap or overlap at ${at}`);
        assert.ok(s.length > 0);
        at += s.length;
      }
      assert.equal(at, realPageBytes(g.spec), `${preset} group ${g.groupId}`);
    }
  }
});

test('page formats: MLA slot 1 of dsv4-mini is latent 56 B at 80, rope 16 B at 136, scales 8 B at 152', () => {
  const spec = presetKVGroups('dsv4-mini')[0]?.spec as MLAAttentionSpec;
  assert.deepEqual(mlaSlotSpans(spec, 1), {
    latent: { offset: 80, length: 56 },
    rope: { offset: 136, length: 16 },
    scales: { offset: 152, length: 8 },
  });
  assert.throws(() => mlaSlotSpans(spec, 16), /outside a block/);
});

/** Standard normal samples from a seeded generator (Box-Muller). */
function normals(rng: SeededRng, n: number): number[] {
  const out: number[] = [];
  while (out.length < n) {
    const u = 1 - rng.next();
    const v = rng.next();
    out.push(Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v));
  }
  return out;
}

test('why zeroing exists: stale f32 compressor bytes read as fp8 MLA latent are NaN, masking keeps NaN, zeroing fixes it', () => {
  const config = makeKVCacheConfig(presetKVGroups('dsv4-mini'), 4); // pages 1..3
  const [mlaGroup, compGroup] = config.groups;
  assert.ok(mlaGroup?.spec.type === 'mla' && compGroup?.spec.type === 'compressor');
  const slabs = Array.from({ length: config.numSlabs }, () => new Uint8Array(slabBytes(config)));
  const m = new KVCacheManager(config, { enableCaching: false });
  const tokens = Array.from({ length: 16 }, (_, i) => i);

  // A: MLA page 1, compressor page 2. The compressor writes f32 state into page 2 of both its slabs.
  assert.deepEqual(m.allocateSlots({ requestId: 'a', tokenIds: tokens }, 16), [[1], [2]]);
  const rng = new SeededRng(2024);
  for (const slab of compGroup.layerNames.map((_, s) => s)) {
    const page = pageRange(config, slab, 2);
    const view = new DataView(slabs[slab]!.buffer, page.offset, page.length);
    const values = normals(rng, 16 * compGroup.spec.stateDim);
    for (let t = 0; t < 16; t++) {
      const span = compressorSlotSpan(compGroup.spec, t);
      for (let k = 0; k < compGroup.spec.stateDim; k++)
        view.setFloat32(span.offset + 4 * k, values[t * compGroup.spec.stateDim + k]!, true);
    }
  }
  // Free A (queue 3, 1, 2), B takes 3 and 1, free B (queue 2, 3, 1): C's MLA page is the compressor's old page 2.
  m.free('a');
  assert.deepEqual(m.allocateSlots({ requestId: 'b', tokenIds: tokens }, 16), [[3], [1]]);
  m.free('b');
  m.takeNewBlockIds();
  assert.deepEqual(m.allocateSlots({ requestId: 'c', tokenIds: tokens }, 16), [[2], [3]]);
  const toZero = m.takeNewBlockIds();
  assert.deepEqual(toZero, [2, 3], 'the manager recorded the reused page for zeroing');

  const latentOfMlaPage = (): number[] =>
    mlaGroup.layerNames.flatMap((_, slab) => {
      const page = pageRange(config, slab, 2);
      return Array.from({ length: 16 }, (_, t) => mlaSlotSpans(mlaGroup.spec as MLAAttentionSpec, t).latent).flatMap(
        (span) =>
          Array.from(
            slabs[slab]!.subarray(page.offset + span.offset, page.offset + span.offset + span.length),
            decodeFp8E4m3,
          ),
      );
    });
  /** A fully masked attention row: weight 0 for every position, value = the decoded latent. */
  const maskedSum = (values: number[]): number => values.reduce((acc, v) => acc + 0 * v, 0);

  const stale = latentOfMlaPage();
  const nanCount = stale.filter(Number.isNaN).length;
  assert.ok(nanCount > 0, 'stale f32 bytes contain fp8 NaN codes (0x7f / 0xff)');
  assert.ok(Number.isNaN(maskedSum(stale)), '0 * NaN = NaN: masking does not hide it');

  // The worker's zeroer: clear the recorded pages in every attention slab.
  for (const slab of attentionSlabs(config)) {
    for (const id of toZero) {
      const page = pageRange(config, slab, id);
      slabs[slab]!.fill(0, page.offset, page.offset + page.length);
    }
  }
  const zeroed = latentOfMlaPage();
  assert.equal(zeroed.filter(Number.isNaN).length, 0);
  assert.equal(maskedSum(zeroed), 0);
});
