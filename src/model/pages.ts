/**
 * Reading and writing the page byte layouts of src/kv/spec.ts, exactly (multi-byte values little
 * endian). Writers encode one token slot; readers decode WHOLE pages of a block table into f64
 * arrays, every slot of every page, so stale bytes anywhere in a page reach the attention.
 *
 *   mla:            slot t at t*tokenBytes:
 *                   [ latent fp8 e4m3 (latentDim) | rope bf16 (ropeDim) | scales f32 (latentDim/scaleTile) ]
 *   full_attention: K of slot t at t*H*D*2, V at blockSize*H*D*2 + t*H*D*2, bf16
 *   compressor:     slot t at t*stateDim*4, f32
 *   mamba:          [ conv state convWidth x convDim | ssm state convDim x ssmStateDim ], f32
 */
import { assert } from '../util/assert.ts';
import { bf16BitsToF32, decodeFp8E4m3, encodeFp8E4m3, f32ToBf16Bits, FP8_E4M3_MAX } from '../kv/codecs.ts';
import {
  tokenBytes,
  type AttentionSpec,
  type CompressorSpec,
  type FullAttentionSpec,
  type MambaSpec,
  type MLAAttentionSpec,
} from '../kv/spec.ts';

const views = new WeakMap<Uint8Array, DataView>();

export function slabView(slab: Uint8Array): DataView {
  let v = views.get(slab);
  if (!v) {
    v = new DataView(slab.buffer, slab.byteOffset, slab.byteLength);
    views.set(slab, v);
  }
  return v;
}

/** The page and slot of token position `pos` through a block table. */
export function slotLocation(
  table: readonly number[],
  blockSize: number,
  pos: number,
  numBlocks: number,
): { block: number; slot: number } {
  const index = Math.floor(pos / blockSize);
  const block = table[index];
  assert(block !== undefined, () => `block table of ${table.length} pages does not cover position ${pos}`);
  assert(
    Number.isInteger(block) && block >= 1 && block < numBlocks,
    () => `block id ${block} is the null block or out of range`,
  );
  return { block, slot: pos % blockSize };
}

/** Byte ranges [start, end) inside a page that a token in `slot` occupies. */
export function slotByteRanges(spec: AttentionSpec, slot: number): Array<[number, number]> {
  if (spec.type === 'full_attention') {
    const hd2 = spec.numKvHeads * spec.headSize * 2;
    const vBase = spec.blockSize * hd2;
    return [
      [slot * hd2, (slot + 1) * hd2],
      [vBase + slot * hd2, vBase + (slot + 1) * hd2],
    ];
  }
  const tb = tokenBytes(spec);
  return [[slot * tb, (slot + 1) * tb]];
}

function checkTable(slab: Uint8Array, pageBytes: number, table: readonly number[]): void {
  for (const b of table)
    assert(Number.isInteger(b) && b >= 1 && (b + 1) * pageBytes <= slab.byteLength, `bad block id ${b}`);
}

// ---- full attention (bf16 K/V) ----

export function writeKvSlot(
  slab: Uint8Array,
  spec: FullAttentionSpec,
  pageBytes: number,
  block: number,
  slot: number,
  k: Float64Array,
  kOff: number,
  v: Float64Array,
  vOff: number,
): void {
  const dv = slabView(slab);
  const hd = spec.numKvHeads * spec.headSize;
  const kBase = block * pageBytes + slot * hd * 2;
  const vBase = block * pageBytes + spec.blockSize * hd * 2 + slot * hd * 2;
  for (let i = 0; i < hd; i++) {
    dv.setUint16(kBase + 2 * i, f32ToBf16Bits(k[kOff + i] as number), true);
    dv.setUint16(vBase + 2 * i, f32ToBf16Bits(v[vOff + i] as number), true);
  }
}

/** Decode K and V of every slot of every page in `table` into [slot][numKvHeads * headSize]; returns the slot count. */
export function readKvPages(
  slab: Uint8Array,
  spec: FullAttentionSpec,
  pageBytes: number,
  table: readonly number[],
  keys: Float64Array,
  values: Float64Array,
): number {
  checkTable(slab, pageBytes, table);
  const dv = slabView(slab);
  const hd = spec.numKvHeads * spec.headSize;
  const bs = spec.blockSize;
  assert(
    keys.length >= table.length * bs * hd && values.length >= table.length * bs * hd,
    'readKvPages: output too small',
  );
  for (let p = 0; p < table.length; p++) {
    const page = (table[p] as number) * pageBytes;
    for (let t = 0; t < bs; t++) {
      const out = (p * bs + t) * hd;
      const kBase = page + t * hd * 2;
      const vBase = page + bs * hd * 2 + t * hd * 2;
      for (let i = 0; i < hd; i++) {
        keys[out + i] = bf16BitsToF32(dv.getUint16(kBase + 2 * i, true));
        values[out + i] = bf16BitsToF32(dv.getUint16(vBase + 2 * i, true));
      }
    }
  }
  return table.length * bs;
}

// ---- MLA latent (fp8 e4m3 NoPE part with per-tile f32 scales, bf16 rope part) ----

/** Store latent[off .. off+latentDim) as fp8 (scale = amax/448 per tile) and the next ropeDim values as bf16. */
export function writeLatentSlot(
  slab: Uint8Array,
  spec: MLAAttentionSpec,
  pageBytes: number,
  block: number,
  slot: number,
  latent: Float64Array,
  off: number,
): void {
  const dv = slabView(slab);
  const base = block * pageBytes + slot * tokenBytes(spec);
  const ropeBase = base + spec.latentDim;
  const scaleBase = ropeBase + spec.ropeDim * 2;
  const tiles = spec.latentDim / spec.scaleTile;
  for (let tile = 0; tile < tiles; tile++) {
    const t0 = off + tile * spec.scaleTile;
    let amax = 0;
    for (let i = 0; i < spec.scaleTile; i++) {
      const a = Math.abs(latent[t0 + i] as number);
      amax = a > amax || Number.isNaN(a) ? a : amax;
    }
    const scale = Math.fround(amax / FP8_E4M3_MAX);
    dv.setFloat32(scaleBase + tile * 4, scale, true);
    for (let i = 0; i < spec.scaleTile; i++) {
      // An all-zero tile has scale 0: store zeros rather than 0/0 = NaN.
      const code = scale === 0 ? 0 : encodeFp8E4m3((latent[t0 + i] as number) / scale);
      dv.setUint8(base + tile * spec.scaleTile + i, code);
    }
  }
  for (let i = 0; i < spec.ropeDim; i++) {
    dv.setUint16(ropeBase + 2 * i, f32ToBf16Bits(latent[off + spec.latentDim + i] as number), true);
  }
}

/** Decode every slot of every page into [slot][latentDim + ropeDim] (dequantized NoPE, then rope). */
export function readLatentPages(
  slab: Uint8Array,
  spec: MLAAttentionSpec,
  pageBytes: number,
  table: readonly number[],
  out: Float64Array,
): number {
  checkTable(slab, pageBytes, table);
  const dv = slabView(slab);
  const bs = spec.blockSize;
  const dim = spec.latentDim + spec.ropeDim;
  const tb = tokenBytes(spec);
  const tiles = spec.latentDim / spec.scaleTile;
  assert(out.length >= table.length * bs * dim, 'readLatentPages: output too small');
  for (let p = 0; p < table.length; p++) {
    const page = (table[p] as number) * pageBytes;
    for (let t = 0; t < bs; t++) {
      const base = page + t * tb;
      const ropeBase = base + spec.latentDim;
      const scaleBase = ropeBase + spec.ropeDim * 2;
      const o = (p * bs + t) * dim;
      for (let tile = 0; tile < tiles; tile++) {
        const scale = dv.getFloat32(scaleBase + tile * 4, true);
        for (let i = 0; i < spec.scaleTile; i++) {
          const j = tile * spec.scaleTile + i;
          out[o + j] = decodeFp8E4m3(dv.getUint8(base + j)) * scale;
        }
      }
      for (let i = 0; i < spec.ropeDim; i++)
        out[o + spec.latentDim + i] = bf16BitsToF32(dv.getUint16(ropeBase + 2 * i, true));
    }
  }
  return table.length * bs;
}

// ---- compressor state (f32) ----

export function writeStateSlot(
  slab: Uint8Array,
  spec: CompressorSpec,
  pageBytes: number,
  block: number,
  slot: number,
  state: Float64Array,
  off: number,
): void {
  const dv = slabView(slab);
  const base = block * pageBytes + slot * spec.stateDim * 4;
  for (let i = 0; i < spec.stateDim; i++) dv.setFloat32(base + 4 * i, state[off + i] as number, true);
}

export function readStatePages(
  slab: Uint8Array,
  spec: CompressorSpec,
  pageBytes: number,
  table: readonly number[],
  out: Float64Array,
): number {
  checkTable(slab, pageBytes, table);
  const dv = slabView(slab);
  const n = table.length * spec.blockSize;
  assert(out.length >= n * spec.stateDim, 'readStatePages: output too small');
  for (let p = 0; p < table.length; p++) {
    const page = (table[p] as number) * pageBytes;
    for (let i = 0; i < spec.blockSize * spec.stateDim; i++) {
      out[p * spec.blockSize * spec.stateDim + i] = dv.getFloat32(page + 4 * i, true);
    }
  }
  return n;
}

// ---- Mamba running state (f32 conv state, then f32 SSM state) ----

export function readMambaState(
  slab: Uint8Array,
  spec: MambaSpec,
  pageBytes: number,
  block: number,
  conv: Float32Array,
  ssm: Float32Array,
): void {
  checkTable(slab, pageBytes, [block]);
  const dv = slabView(slab);
  const base = block * pageBytes;
  const nConv = spec.convWidth * spec.convDim;
  assert(conv.length === nConv && ssm.length === spec.convDim * spec.ssmStateDim, 'readMambaState: wrong state sizes');
  for (let i = 0; i < nConv; i++) conv[i] = dv.getFloat32(base + 4 * i, true);
  for (let i = 0; i < ssm.length; i++) ssm[i] = dv.getFloat32(base + 4 * (nConv + i), true);
}

export function writeMambaState(
  slab: Uint8Array,
  spec: MambaSpec,
  pageBytes: number,
  block: number,
  conv: Float32Array,
  ssm: Float32Array,
): void {
  checkTable(slab, pageBytes, [block]);
  const dv = slabView(slab);
  const base = block * pageBytes;
  const nConv = spec.convWidth * spec.convDim;
  assert(conv.length === nConv && ssm.length === spec.convDim * spec.ssmStateDim, 'writeMambaState: wrong state sizes');
  for (let i = 0; i < nConv; i++) dv.setFloat32(base + 4 * i, conv[i] as number, true);
  for (let i = 0; i < ssm.length; i++) dv.setFloat32(base + 4 * (nConv + i), ssm[i] as number, true);
}
