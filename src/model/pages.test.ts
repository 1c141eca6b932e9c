/**
 * Proves the page codecs write exactly the byte layouts of src/kv/spec.ts (offsets computed by hand
 * here), touch nothing else, and read back what they wrote (bf16/f32 exactly, fp8 within its precision).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { encodeFp8E4m3, f32ToBf16Bits, roundBf16 } from '../kv/codecs.ts';
import { presetKVGroups } from '../kv/presets.ts';
import type { CompressorSpec, FullAttentionSpec, MambaSpec, MLAAttentionSpec } from '../kv/spec.ts';
import {
  readKvPages,
  readLatentPages,
  readMambaState,
  readStatePages,
  slotLocation,
  writeKvSlot,
  writeLatentSlot,
  writeMambaState,
  writeStateSlot,
} from './pages.ts';

const PAGE = 4096;
const specOf = <T>(preset: 'dsv4-mini' | 'hybrid-mini', g: number): T => presetKVGroups(preset)[g]?.spec as T;
const u16 = (b: Uint8Array, at: number): number => (b[at] as number) | ((b[at + 1] as number) << 8);
const f32At = (b: Uint8Array, at: number): number => new DataView(b.buffer, b.byteOffset).getFloat32(at, true);
const nonZeroOutside = (b: Uint8Array, ranges: Array<[number, number]>): number =>
  b.reduce((n, v, i) => (v !== 0 && !ranges.some(([s, e]) => i >= s && i < e) ? n + 1 : n), 0);

test('bf16 GQA slot: K at t*H*D*2, V at blockSize*H*D*2 + t*H*D*2, little endian; read back exactly', () => {
  const spec = specOf<FullAttentionSpec>('hybrid-mini', 0); // H=2, D=16, blockSize 16
  const slab = new Uint8Array(4 * PAGE);
  const k = Float64Array.from({ length: 32 }, (_, i) => (i - 10) * 0.37);
  const v = Float64Array.from({ length: 32 }, (_, i) => -i * 1.01);
  writeKvSlot(slab, spec, PAGE, 2, 3, k, 0, v, 0);
  const kAt = 2 * PAGE + 3 * 64;
  const vAt = 2 * PAGE + 16 * 64 + 3 * 64;
  for (let i = 0; i < 32; i++) {
    assert.equal(u16(slab, kAt + 2 * i), f32ToBf16Bits(k[i] as number));
    assert.equal(u16(slab, vAt + 2 * i), f32ToBf16Bits(v[i] as number));
  }
  assert.equal(
    nonZeroOutside(slab, [
      [kAt, kAt + 64],
      [vAt, vAt + 64],
    ]),
    0,
  );
  const keys = new Float64Array(16 * 32);
  const values = new Float64Array(16 * 32);
  assert.equal(readKvPages(slab, spec, PAGE, [2], keys, values), 16);
  for (let i = 0; i < 32; i++) {
    assert.equal(keys[3 * 32 + i], roundBf16(k[i] as number));
    assert.equal(values[3 * 32 + i], roundBf16(v[i] as number));
  }
});

test('fp8 MLA slot: codes, bf16 rope and f32 scales (amax/448 per 28) at their offsets; dequantized within fp8 precision', () => {
  const spec = specOf<MLAAttentionSpec>('dsv4-mini', 0); // latent 56, rope 8, tile 28: 80 B per token
  const slab = new Uint8Array(3 * PAGE);
  const lat = Float64Array.from({ length: 64 }, (_, i) => Math.sin(i * 1.3) * (i < 28 ? 3 : 0.02));
  writeLatentSlot(slab, spec, PAGE, 1, 5, lat, 0);
  const base = PAGE + 5 * 80;
  for (let tile = 0; tile < 2; tile++) {
    const amax = Math.max(...Array.from(lat.subarray(tile * 28, tile * 28 + 28), Math.abs));
    const scale = Math.fround(amax / 448);
    assert.equal(f32At(slab, base + 72 + 4 * tile), scale);
    for (let i = 0; i < 28; i++)
      assert.equal(slab[base + tile * 28 + i], encodeFp8E4m3((lat[tile * 28 + i] as number) / scale));
  }
  for (let i = 0; i < 8; i++) assert.equal(u16(slab, base + 56 + 2 * i), f32ToBf16Bits(lat[56 + i] as number));
  assert.equal(nonZeroOutside(slab, [[base, base + 80]]), 0);
  const out = new Float64Array(16 * 64);
  readLatentPages(slab, spec, PAGE, [1], out);
  for (let i = 0; i < 56; i++) {
    const amax = i < 28 ? 3 : 0.02;
    assert.ok(Math.abs((out[5 * 64 + i] as number) - (lat[i] as number)) <= amax / 16, `latent ${i}`);
  }
  for (let i = 0; i < 8; i++) assert.equal(out[5 * 64 + 56 + i], roundBf16(lat[56 + i] as number));
});

test('fp8 MLA: an all-zero tile stores scale 0 and zero codes (never 0/0 = NaN)', () => {
  const spec = specOf<MLAAttentionSpec>('dsv4-mini', 0);
  const slab = new Uint8Array(2 * PAGE);
  writeLatentSlot(slab, spec, PAGE, 1, 0, new Float64Array(64), 0);
  const out = new Float64Array(16 * 64);
  readLatentPages(slab, spec, PAGE, [1], out);
  assert.ok(out.every((x) => x === 0));
  assert.ok(slab.every((b) => b === 0));
});

test('compressor slot: f32 at t*stateDim*4; Mamba page: conv state then SSM state; both read back exactly', () => {
  const comp = specOf<CompressorSpec>('dsv4-mini', 1);
  const slab = new Uint8Array(3 * PAGE);
  const state = Float64Array.from({ length: 20 }, (_, i) => Math.fround(i / 7 - 1));
  writeStateSlot(slab, comp, PAGE, 2, 15, state, 0);
  for (let i = 0; i < 20; i++) assert.equal(f32At(slab, 2 * PAGE + 15 * 80 + 4 * i), state[i]);
  const states = new Float64Array(16 * 20);
  readStatePages(slab, comp, PAGE, [2], states);
  assert.deepEqual(Array.from(states.subarray(15 * 20)), Array.from(state));

  const mamba = specOf<MambaSpec>('hybrid-mini', 1); // conv 3 x 64, ssm 64 x 8
  const m = new Uint8Array(3 * PAGE);
  const conv = Float32Array.from({ length: 192 }, (_, i) => i * 0.25);
  const ssm = Float32Array.from({ length: 512 }, (_, i) => -i * 0.125);
  writeMambaState(m, mamba, PAGE, 1, conv, ssm);
  assert.equal(f32At(m, PAGE + 4 * 5), 1.25);
  assert.equal(f32At(m, PAGE + 192 * 4 + 4 * 3), -0.375);
  assert.equal(nonZeroOutside(m, [[PAGE, PAGE + (192 + 512) * 4]]), 0);
  const conv2 = new Float32Array(192);
  const ssm2 = new Float32Array(512);
  readMambaState(m, mamba, PAGE, 1, conv2, ssm2);
  assert.deepEqual([conv2, ssm2], [conv, ssm]);
});

test('slotLocation: position -> (page, slot) through the table; the null block and short tables are programmer errors', () => {
  assert.deepEqual(slotLocation([4, 9, 2], 16, 33, 10), { block: 2, slot: 1 });
  assert.throws(() => slotLocation([4], 16, 16, 10), /does not cover/);
  assert.throws(() => slotLocation([0], 16, 0, 10), /null block/);
  assert.throws(() => slotLocation([10], 16, 0, 10), /out of range/);
});
