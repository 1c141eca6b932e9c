/**
 * Byte layout inside one page, per spec (offsets relative to the page start; see spec.ts):
 *
 *   mla:            slot t at t*tokenBytes:
 *                   [ latent fp8 (latentDim) | rope bf16 (ropeDim*2) | scales f32 ((latentDim/scaleTile)*4) ]
 *   full_attention: K of slot t at t*H*D*2, V of slot t at blockSize*H*D*2 + t*H*D*2
 *   compressor:     slot t at t*stateDim*4 (f32)
 *   mamba:          [ conv state convWidth x convDim f32 | ssm state convDim x ssmStateDim f32 ]
 *
 * Bytes from realPageBytes(spec) to the padded page end belong to nobody and are never read.
 */
import { assert } from '../util/assert.ts';
import {
  tokenBytes,
  type CompressorSpec,
  type FullAttentionSpec,
  type MambaSpec,
  type MLAAttentionSpec,
} from './spec.ts';

export interface ByteSpan {
  offset: number;
  length: number;
}

function checkSlot(blockSize: number, slot: number): void {
  assert(Number.isInteger(slot) && slot >= 0 && slot < blockSize, `token slot ${slot} outside a block of ${blockSize}`);
}

export function mlaSlotSpans(
  spec: MLAAttentionSpec,
  slot: number,
): { latent: ByteSpan; rope: ByteSpan; scales: ByteSpan } {
  checkSlot(spec.blockSize, slot);
  const base = slot * tokenBytes(spec);
  const ropeAt = base + spec.latentDim;
  const scalesAt = ropeAt + spec.ropeDim * 2;
  return {
    latent: { offset: base, length: spec.latentDim },
    rope: { offset: ropeAt, length: spec.ropeDim * 2 },
    scales: { offset: scalesAt, length: (spec.latentDim / spec.scaleTile) * 4 },
  };
}

export function fullAttentionSlotSpans(spec: FullAttentionSpec, slot: number): { key: ByteSpan; value: ByteSpan } {
  checkSlot(spec.blockSize, slot);
  const slotBytes = spec.numKvHeads * spec.headSize * 2;
  return {
    key: { offset: slot * slotBytes, length: slotBytes },
    value: { offset: spec.blockSize * slotBytes + slot * slotBytes, length: slotBytes },
  };
}

export function compressorSlotSpan(spec: CompressorSpec, slot: number): ByteSpan {
  checkSlot(spec.blockSize, slot);
  return { offset: slot * spec.stateDim * 4, length: spec.stateDim * 4 };
}

export function mambaStateSpans(spec: MambaSpec): { conv: ByteSpan; ssm: ByteSpan } {
  const convBytes = spec.convWidth * spec.convDim * 4;
  return {
    conv: { offset: 0, length: convBytes },
    ssm: { offset: convBytes, length: spec.convDim * spec.ssmStateDim * 4 },
  };
}
