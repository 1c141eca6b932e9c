/**
 * Model shapes, derived from the KV cache groups of a preset (src/kv/presets.ts), so the model's
 * layers and the cache cannot disagree: layer i's cache is wherever kvConfig puts 'layers.i.<kind>'.
 *
 *   dsv4-mini:   layer i = MLA attention (group 0, slab i) + compressor (group 1, slab i) + MLP
 *   hybrid-mini: layers 0, 2 = GQA attention (group 0), layers 1, 3 = Mamba (group 1); each + MLP
 *   llama-mini:  layers 0, 1 = GQA attention (group 0) + MLP
 */
import { HandoffError } from '../util/errors.ts';
import { isMicroPreset, presetKVGroups, type ModelPreset } from '../kv/presets.ts';
import {
  layerPlacements,
  rankSpec,
  type CompressorSpec,
  type FullAttentionSpec,
  type KVCacheConfig,
  type KVCacheSpec,
  type MambaSpec,
  type MLAAttentionSpec,
} from '../kv/spec.ts';

export const HIDDEN = 64;
/** GPT-2 vocabulary (js-tiktoken gpt2 ranks, EOS 50256): the serving presets. */
export const VOCAB_SIZE = 50257;
export const MLP_HIDDEN = 128;
/** Micro presets (the simulator's): a tiny vocabulary and MLP; EOS is the last id. */
export const MICRO_VOCAB_SIZE = 64;
export const MICRO_HIDDEN = 8;
export const MICRO_MLP_HIDDEN = 8;

/** The residual width of a preset (its MLA latent + rope, its Mamba conv width). */
export function hiddenOf(preset: ModelPreset): number {
  return isMicroPreset(preset) ? MICRO_HIDDEN : HIDDEN;
}

/** The vocabulary size of a preset: token ids are in [0, vocabSizeOf(preset)). */
export function vocabSizeOf(preset: ModelPreset): number {
  return isMicroPreset(preset) ? MICRO_VOCAB_SIZE : VOCAB_SIZE;
}

/** The end-of-sequence token of a preset. */
export function eosTokenIdOf(preset: ModelPreset): number {
  return vocabSizeOf(preset) - 1;
}
export const NUM_QUERY_HEADS = 4;
export const MICRO_QUERY_HEADS = 2;
export const ROPE_THETA = 10000;
export const RMS_EPS = 1e-6;

/** Where one cached tensor of a layer lives: its group (block table index) and slab. */
export interface CachePlace<S extends KVCacheSpec> {
  group: number;
  slab: number;
  spec: S;
}

export type LayerPlan =
  | { kind: 'gqa'; index: number; numHeads: number; cache: CachePlace<FullAttentionSpec> }
  | {
      kind: 'mla';
      index: number;
      numHeads: number;
      cache: CachePlace<MLAAttentionSpec>;
      compressor: CachePlace<CompressorSpec>;
    }
  | { kind: 'mamba'; index: number; cache: CachePlace<MambaSpec> };

export interface ModelConfig {
  preset: ModelPreset;
  hidden: number;
  vocabSize: number;
  mlpHidden: number;
  ropeTheta: number;
  rmsEps: number;
  /** The lm head is the embedding matrix (tied); false for every preset (see weights.ts). */
  tiedEmbeddings: boolean;
  pageBytes: number;
  numBlocks: number;
  /** Ranks the model is split over; each layer's cache place describes one rank's share (kv/spec.ts). */
  tensorParallelSize: number;
  layers: LayerPlan[];
}

/** A spec without its padding, for comparing a config against the preset it claims to be. */
function unpadded(spec: KVCacheSpec): string {
  const { pageSizePadded: _ignored, ...rest } = spec;
  return JSON.stringify(rest, Object.keys(rest).sort());
}

function checkMatchesPreset(preset: ModelPreset, kvConfig: KVCacheConfig): void {
  const want = presetKVGroups(preset, kvConfig.groups[0]?.spec.blockSize);
  const same =
    want.length === kvConfig.groups.length &&
    want.every((g, i) => {
      const got = kvConfig.groups[i];
      return (
        got !== undefined &&
        got.groupId === g.groupId &&
        got.layerNames.join(',') === g.layerNames.join(',') &&
        unpadded(got.spec) === unpadded(rankSpec(g.spec, kvConfig.tensorParallelSize))
      );
    });
  if (!same) throw new HandoffError('BAD_CONFIG', `KV cache config does not match the groups of preset ${preset}`);
}

export function modelConfig(preset: ModelPreset, kvConfig: KVCacheConfig): ModelConfig {
  checkMatchesPreset(preset, kvConfig);
  const byLayer = new Map<number, Map<string, CachePlace<KVCacheSpec>>>();
  for (const p of layerPlacements(kvConfig)) {
    const m = /^layers\.(\d+)\.(attn|compressor|mamba)$/.exec(p.layerName);
    if (!m) throw new HandoffError('BAD_CONFIG', `unknown layer name ${p.layerName}`);
    const index = Number(m[1]);
    const spec = kvConfig.groups[p.groupId]?.spec;
    if (!spec) throw new HandoffError('BAD_CONFIG', `layer ${p.layerName} has no group spec`);
    const parts = byLayer.get(index) ?? new Map<string, CachePlace<KVCacheSpec>>();
    parts.set(m[2] as string, { group: p.groupId, slab: p.slab, spec });
    byLayer.set(index, parts);
  }
  const indices = [...byLayer.keys()].sort((a, b) => a - b);
  const layers = indices.map((index, i): LayerPlan => {
    if (index !== i) throw new HandoffError('BAD_CONFIG', `layer indices must be 0..n-1, missing ${i}`);
    return layerPlan(
      index,
      byLayer.get(index) as Map<string, CachePlace<KVCacheSpec>>,
      hiddenOf(preset),
      queryHeadsOf(preset),
      kvConfig.tensorParallelSize,
    );
  });
  return {
    preset,
    hidden: hiddenOf(preset),
    vocabSize: vocabSizeOf(preset),
    mlpHidden: isMicroPreset(preset) ? MICRO_MLP_HIDDEN : MLP_HIDDEN,
    ropeTheta: ROPE_THETA,
    rmsEps: RMS_EPS,
    tiedEmbeddings: false,
    pageBytes: kvConfig.pageBytes,
    numBlocks: kvConfig.numBlocks,
    tensorParallelSize: kvConfig.tensorParallelSize,
    layers,
  };
}

/** Query heads per attention layer: 4, and 2 for the micro presets. */
function queryHeadsOf(preset: ModelPreset): number {
  return isMicroPreset(preset) ? MICRO_QUERY_HEADS : NUM_QUERY_HEADS;
}

function layerPlan(
  index: number,
  parts: Map<string, CachePlace<KVCacheSpec>>,
  hidden: number,
  numHeads: number,
  tp: number,
): LayerPlan {
  const attn = parts.get('attn');
  const comp = parts.get('compressor');
  const mamba = parts.get('mamba');
  if (numHeads % tp !== 0) throw new HandoffError('BAD_CONFIG', `${numHeads} query heads cannot be split over ${tp}`);
  if (mamba && !attn && !comp && mamba.spec.type === 'mamba') {
    if (mamba.spec.convDim * tp !== hidden)
      throw new HandoffError('BAD_CONFIG', `mamba convDim must be ${hidden} (${hidden / tp} per rank)`);
    return { kind: 'mamba', index, cache: { ...mamba, spec: mamba.spec } };
  }
  if (attn?.spec.type === 'mla' && comp?.spec.type === 'compressor' && !mamba) {
    const spec = attn.spec;
    if (spec.latentDim + spec.ropeDim !== hidden || spec.ropeDim % 2 !== 0 || spec.latentDim % spec.scaleTile !== 0) {
      throw new HandoffError('BAD_CONFIG', `MLA latent ${spec.latentDim}+${spec.ropeDim} must be ${hidden}, rope even`);
    }
    return {
      kind: 'mla',
      index,
      numHeads,
      cache: { ...attn, spec },
      compressor: { ...comp, spec: comp.spec },
    };
  }
  if (attn?.spec.type === 'full_attention' && !comp && !mamba) {
    const spec = attn.spec;
    if (numHeads % spec.numKvHeads !== 0 || spec.headSize % 2 !== 0) {
      throw new HandoffError('BAD_CONFIG', `GQA needs ${numHeads} query heads divisible by kv heads, even head size`);
    }
    return { kind: 'gqa', index, numHeads, cache: { ...attn, spec } };
  }
  throw new HandoffError(
    'BAD_CONFIG',
    `layer ${index}: unsupported combination of caches ${[...parts.keys()].join('+')}`,
  );
}
