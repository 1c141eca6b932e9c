/**
 * KV cache specs, page sizes, groups, and the zeroing rule.
 *
 * A spec describes one kind of cache page. All groups draw block ids from one BlockPool and their
 * pages live in shared slabs (one slab per layer index, DESIGN.md §4), so every group's page is
 * padded to one common `pageBytes`. Layer j of group g lives in slab j.
 *
 *   slab j:  | block 0 (null) | block 1 | block 2 | ... | block numBlocks-1 |   each pageBytes long
 *             layer j of group A and layer j of group B alias these bytes.
 *
 * Per-token page formats (byte offsets inside one page, token slot t of blockSize):
 *   mla (fp8_ds_mla-like):  t*tokenBytes +
 *                           [ latent fp8 (latentDim) | rope bf16 (ropeDim*2) | scales f32 ((latentDim/scaleTile)*4) ]
 *   full_attention (bf16):  K at t*H*D*2, V at blockSize*H*D*2 + t*H*D*2     (K block then V block)
 *   compressor (f32):       t*stateDim*4
 *   mamba (f32, one running state per request): [ conv state convWidth x convDim | ssm state convDim x ssmStateDim ]
 */
import { assert } from '../util/assert.ts';

export type KVDType = 'uint8' | 'bf16' | 'f32';
export type KVQuantMode = 'none' | 'fp8_ds_mla';

export interface FullAttentionSpec {
  type: 'full_attention';
  blockSize: number;
  numKvHeads: number;
  headSize: number;
  dtype: 'bf16';
  kvQuantMode: 'none';
  pageSizePadded?: number;
}

/** MLA latent cache in an fp8_ds_mla-like format: fp8 NoPE latent, bf16 rope part, f32 scales. */
export interface MLAAttentionSpec {
  type: 'mla';
  blockSize: number;
  latentDim: number;
  ropeDim: number;
  scaleTile: number;
  dtype: 'uint8';
  kvQuantMode: 'fp8_ds_mla';
  pageSizePadded?: number;
}

/** Compressor state cache (DeepSeek-V4 style): one f32 vector per token, an attention-type spec. */
export interface CompressorSpec {
  type: 'compressor';
  blockSize: number;
  stateDim: number;
  dtype: 'f32';
  kvQuantMode: 'none';
  pageSizePadded?: number;
}

/** Mamba-style recurrent state: conv state + SSM state, f32, one running page per request. */
export interface MambaSpec {
  type: 'mamba';
  blockSize: number;
  convDim: number;
  convWidth: number;
  ssmStateDim: number;
  dtype: 'f32';
  pageSizePadded?: number;
}

export type AttentionSpec = FullAttentionSpec | MLAAttentionSpec | CompressorSpec;
export type KVCacheSpec = AttentionSpec | MambaSpec;

export function isAttentionSpec(spec: KVCacheSpec): spec is AttentionSpec {
  return spec.type !== 'mamba';
}

export const DTYPE_BYTES: Record<KVDType, number> = { uint8: 1, bf16: 2, f32: 4 };

/** Bytes one token occupies in an attention page. */
export function tokenBytes(spec: AttentionSpec): number {
  switch (spec.type) {
    case 'full_attention':
      return 2 * spec.numKvHeads * spec.headSize * 2;
    case 'mla':
      assert(spec.latentDim % spec.scaleTile === 0, 'latentDim must be a multiple of scaleTile');
      return spec.latentDim + spec.ropeDim * 2 + (spec.latentDim / spec.scaleTile) * 4;
    case 'compressor':
      return spec.stateDim * 4;
  }
}

export function realPageBytes(spec: KVCacheSpec): number {
  if (spec.type === 'mamba') return (spec.convWidth * spec.convDim + spec.convDim * spec.ssmStateDim) * 4;
  return spec.blockSize * tokenBytes(spec);
}

export function pageBytes(spec: KVCacheSpec): number {
  const real = realPageBytes(spec);
  if (spec.pageSizePadded === undefined) return real;
  assert(spec.pageSizePadded >= real, `pageSizePadded ${spec.pageSizePadded} < real page ${real}`);
  return spec.pageSizePadded;
}

/** The (dtype, quant mode) pair that decides mixed precision. */
export function precisionKey(spec: AttentionSpec): string {
  return `${spec.dtype}/${spec.kvQuantMode}`;
}

export interface KVCacheGroupSpec {
  groupId: number;
  layerNames: string[];
  spec: KVCacheSpec;
}

export interface KVCacheConfig {
  numBlocks: number;
  /** Common (padded) page size of every group: each slab is numBlocks * pageBytes. */
  pageBytes: number;
  /** One slab per layer index: max layers in a group. */
  numSlabs: number;
  groups: KVCacheGroupSpec[];
  hasMambaLayers: boolean;
  hasMixedPrecisionKvCache: boolean;
  needsKvCacheZeroing: boolean;
}

export function hasMambaLayers(groups: readonly KVCacheGroupSpec[]): boolean {
  return groups.some((g) => g.spec.type === 'mamba');
}

export function hasMixedPrecisionKvCache(groups: readonly KVCacheGroupSpec[]): boolean {
  const keys = new Set(groups.filter((g) => isAttentionSpec(g.spec)).map((g) => precisionKey(g.spec as AttentionSpec)));
  return keys.size > 1;
}

/**
 * New pages must be zeroed when stale bytes of another format can be reread as this one: with Mamba
 * state (f32) sharing slabs with attention, or with more than one attention precision.
 */
export function needsKvCacheZeroing(groups: readonly KVCacheGroupSpec[]): boolean {
  return hasMambaLayers(groups) || hasMixedPrecisionKvCache(groups);
}

/** Pad every group's spec to the largest page, and build the config. */
export function makeKVCacheConfig(groups: KVCacheGroupSpec[], numBlocks: number): KVCacheConfig {
  assert(groups.length > 0, 'a KV cache needs at least one group');
  assert(Number.isInteger(numBlocks) && numBlocks >= 2, `numBlocks must be an integer >= 2, got ${numBlocks}`);
  groups.forEach((g, i) => assert(g.groupId === i, `group ids must be 0..n-1 in order (got ${g.groupId} at ${i})`));
  const common = Math.max(...groups.map((g) => pageBytes(g.spec)));
  const padded = groups.map((g) => ({
    ...g,
    spec: pageBytes(g.spec) === common ? g.spec : { ...g.spec, pageSizePadded: common },
  }));
  return {
    numBlocks,
    pageBytes: common,
    numSlabs: Math.max(...groups.map((g) => g.layerNames.length)),
    groups: padded,
    hasMambaLayers: hasMambaLayers(padded),
    hasMixedPrecisionKvCache: hasMixedPrecisionKvCache(padded),
    needsKvCacheZeroing: needsKvCacheZeroing(padded),
  };
}

/** Where a layer's cache lives: its group and slab. */
export interface LayerPlacement {
  layerName: string;
  groupId: number;
  slab: number;
}

export function layerPlacements(config: KVCacheConfig): LayerPlacement[] {
  return config.groups.flatMap((g) => g.layerNames.map((layerName, slab) => ({ layerName, groupId: g.groupId, slab })));
}

/** Slabs that hold attention layers: the ones the zeroer clears. */
export function attentionSlabs(config: KVCacheConfig): number[] {
  const slabs = new Set<number>();
  for (const p of layerPlacements(config)) {
    const spec = config.groups[p.groupId]?.spec;
    if (spec && isAttentionSpec(spec)) slabs.add(p.slab);
  }
  return [...slabs].sort((a, b) => a - b);
}
