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
 * Tensor parallelism (TP ranks, `tensorParallelSize`): every rank has its own slabs, one per layer index,
 * and holds its share of each cache in them (rankSpec): GQA K/V of its KV heads, the compressor state of
 * its compressor heads, the Mamba state of its channels; the MLA latent is replicated (every rank holds
 * all of it, as in vLLM). Device slab of (rank r, layer slab j) = r * numLayerSlabs + j:
 *
 *   device slabs: | r0 layer 0 | r0 layer 1 | ... | r1 layer 0 | r1 layer 1 | ... |   numSlabs = TP * numLayerSlabs
 *
 * A rank's page has the TP=1 layout of its own spec, its local heads (channels) in global order: local
 * head h of rank r is global head r * (H / TP) + h. So rank r's GQA K of token slot t, local head h, is at
 * t*(H/TP)*D*2 + h*D*2 of its page (token-major, NHD); at TP=1 the same head sits at t*H*D*2 + (r*H/TP + h)*D*2.
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
  /** Common (padded) page size of every group on one rank: each slab is numBlocks * pageBytes. */
  pageBytes: number;
  /** Every rank's slabs: tensorParallelSize * numLayerSlabs (device slab = rank * numLayerSlabs + layer slab). */
  numSlabs: number;
  /** One slab per layer index on each rank: max layers in a group. */
  numLayerSlabs: number;
  /** Ranks the model and its cache are split over (1: no tensor parallelism). */
  tensorParallelSize: number;
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

/**
 * One rank's share of a cache at `tp` ranks: GQA KV heads, compressor heads and Mamba channels are split
 * (each rank holds a contiguous 1/tp of them), the MLA latent is replicated. Programmer error if `tp`
 * does not divide them (flags are checked earlier, see presets.ts checkTensorParallelSize).
 */
export function rankSpec(spec: KVCacheSpec, tp: number): KVCacheSpec {
  assert(Number.isInteger(tp) && tp >= 1, `tensor parallel size must be a positive integer, got ${tp}`);
  if (tp === 1) return spec;
  const split = (n: number, what: string): number => {
    assert(n % tp === 0, `${n} ${what} cannot be split over ${tp} ranks`);
    return n / tp;
  };
  switch (spec.type) {
    case 'full_attention':
      return { ...spec, numKvHeads: split(spec.numKvHeads, 'KV heads') };
    case 'compressor':
      return { ...spec, stateDim: split(spec.stateDim, 'compressor state values') };
    case 'mamba':
      return { ...spec, convDim: split(spec.convDim, 'Mamba channels') };
    case 'mla':
      return spec;
  }
}

/**
 * The whole (TP=1) spec a rank's share at `tp` ranks was cut from: the inverse of rankSpec, padding
 * dropped. Peers of different degrees compare and map their caches through it (kv/tp_map.ts).
 */
export function wholeSpec(spec: KVCacheSpec, tp: number): KVCacheSpec {
  assert(Number.isInteger(tp) && tp >= 1, `tensor parallel size must be a positive integer, got ${tp}`);
  const { pageSizePadded: _pad, ...s } = spec;
  switch (s.type) {
    case 'full_attention':
      return { ...s, numKvHeads: s.numKvHeads * tp };
    case 'compressor':
      return { ...s, stateDim: s.stateDim * tp };
    case 'mamba':
      return { ...s, convDim: s.convDim * tp };
    case 'mla':
      return s;
  }
}

/**
 * The cache of one instance: `groups` are the model's (whole) caches; the config holds each rank's share
 * (rankSpec), every group's page padded to the largest.
 */
export function makeKVCacheConfig(groups: KVCacheGroupSpec[], numBlocks: number, tp = 1): KVCacheConfig {
  assert(groups.length > 0, 'a KV cache needs at least one group');
  assert(Number.isInteger(numBlocks) && numBlocks >= 2, `numBlocks must be an integer >= 2, got ${numBlocks}`);
  groups.forEach((g, i) => assert(g.groupId === i, `group ids must be 0..n-1 in order (got ${g.groupId} at ${i})`));
  const ranked = groups.map((g) => ({ ...g, spec: rankSpec(g.spec, tp) }));
  const common = Math.max(...ranked.map((g) => pageBytes(g.spec)));
  const padded = ranked.map((g) => ({
    ...g,
    spec: pageBytes(g.spec) === common ? g.spec : { ...g.spec, pageSizePadded: common },
  }));
  const numLayerSlabs = Math.max(...groups.map((g) => g.layerNames.length));
  return {
    numBlocks,
    pageBytes: common,
    numSlabs: tp * numLayerSlabs,
    numLayerSlabs,
    tensorParallelSize: tp,
    groups: padded,
    hasMambaLayers: hasMambaLayers(padded),
    hasMixedPrecisionKvCache: hasMixedPrecisionKvCache(padded),
    needsKvCacheZeroing: needsKvCacheZeroing(padded),
  };
}

/** Where a layer's cache lives: its group and its layer slab (on every rank: see deviceSlab). */
export interface LayerPlacement {
  layerName: string;
  groupId: number;
  slab: number;
}

/** The device slab of layer slab `layerSlab` on rank `rank`. */
export function deviceSlab(config: KVCacheConfig, rank: number, layerSlab: number): number {
  assert(
    Number.isInteger(rank) && rank >= 0 && rank < config.tensorParallelSize,
    `rank ${rank} out of [0, ${config.tensorParallelSize})`,
  );
  assert(
    Number.isInteger(layerSlab) && layerSlab >= 0 && layerSlab < config.numLayerSlabs,
    `layer slab ${layerSlab} out of [0, ${config.numLayerSlabs})`,
  );
  return rank * config.numLayerSlabs + layerSlab;
}

/** The device slabs of the given layer slabs on every rank, rank-major. */
export function everyRankSlabs(config: KVCacheConfig, layerSlabs: readonly number[]): number[] {
  const out: number[] = [];
  for (let r = 0; r < config.tensorParallelSize; r++) for (const s of layerSlabs) out.push(deviceSlab(config, r, s));
  return out;
}

export function layerPlacements(config: KVCacheConfig): LayerPlacement[] {
  return config.groups.flatMap((g) => g.layerNames.map((layerName, slab) => ({ layerName, groupId: g.groupId, slab })));
}

/** Device slabs that hold attention layers, on every rank: the ones the zeroer clears. */
export function attentionSlabs(config: KVCacheConfig): number[] {
  const slabs = new Set<number>();
  for (const p of layerPlacements(config)) {
    const spec = config.groups[p.groupId]?.spec;
    if (spec && isAttentionSpec(spec)) slabs.add(p.slab);
  }
  return everyRankSlabs(
    config,
    [...slabs].sort((a, b) => a - b),
  );
}
