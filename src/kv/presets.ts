/**
 * KV cache groups of the model presets (DESIGN.md §5). The model layer builds its layers from these
 * same groups, so cache and model cannot disagree.
 *
 *   dsv4-mini:   MLA fp8 (uint8) pages + compressor f32 pages  -> mixed precision, zeroing, no Mamba
 *   hybrid-mini: bf16 attention + Mamba conv/SSM f32 state     -> Mamba, zeroing
 *   llama-mini:  bf16 GQA only                                  -> uniform, no zeroing
 *
 * Each has a `-micro` twin for the simulator: the same KV groups (kinds, dtypes, fp8 page format, block
 * size, layer placement; every forward still reads every cached byte, so stale bytes still turn into
 * NaN) with smaller tensors (a 16-wide model), and a tiny vocabulary and MLP (model/config.ts), so a
 * forward costs microseconds instead of the 50k-row lm head. Serving keeps the mini presets: the
 * micro vocabulary is not GPT-2's, so there is no tokenizer for it.
 */
import { HandoffError } from '../util/errors.ts';
import type { KVCacheGroupSpec } from './spec.ts';

export const SERVING_PRESETS = ['dsv4-mini', 'hybrid-mini', 'llama-mini'] as const;
export const MICRO_PRESETS = ['dsv4-micro', 'hybrid-micro', 'llama-micro'] as const;
export const MODEL_PRESETS = [...SERVING_PRESETS, ...MICRO_PRESETS] as const;
export type ServingPreset = (typeof SERVING_PRESETS)[number];
export type MicroPreset = (typeof MICRO_PRESETS)[number];
export type ModelPreset = ServingPreset | MicroPreset;

export const BLOCK_SIZE = 16;

/**
 * Shards every preset's model is split into for tensor parallelism (model/parallel.ts): its KV heads
 * (GQA presets have 2), query heads, compressor heads, MLP and Mamba channels and vocabulary, each cut
 * into TP_SHARDS equal parts. A TP degree must divide it; reductions always add the shards' partial sums
 * in shard order, whatever the degree, so every degree gives the same bits.
 */
export const TP_SHARDS = 2;

/** Tensor parallel degrees every preset supports: the divisors of TP_SHARDS. */
export const TENSOR_PARALLEL_SIZES: readonly number[] = Array.from({ length: TP_SHARDS }, (_, i) => i + 1).filter(
  (n) => TP_SHARDS % n === 0,
);

/** A tensor parallel degree must divide the preset's KV heads and the model's shard count; BAD_CONFIG if not. */
export function checkTensorParallelSize(preset: ModelPreset, tp: unknown, flag = 'tensor-parallel-size'): number {
  const kvHeads = presetKVGroups(preset).map((g) => (g.spec.type === 'full_attention' ? g.spec.numKvHeads : TP_SHARDS));
  // A flag's text is a plain decimal integer, as every integer flag ('0x2', '2.0', '2e0' are not read as 2).
  const text = String(tp).trim();
  const n = typeof tp === 'number' ? tp : /^(0|[1-9][0-9]*)$/.test(text) ? Number(text) : Number.NaN;
  const ok = Number.isInteger(n) && n >= 1 && TP_SHARDS % n === 0 && kvHeads.every((h) => h % n === 0);
  if (!ok) {
    const heads = kvTwin(preset) === 'dsv4-mini' ? 'a replicated MLA latent' : `${Math.min(...kvHeads)} KV heads`;
    throw new HandoffError(
      'BAD_CONFIG',
      `--${flag} must divide the KV heads and the ${TP_SHARDS} model shards of ${preset} (${heads}): ` +
        `use one of ${TENSOR_PARALLEL_SIZES.join(', ')}; got '${String(tp)}'`,
    );
  }
  return n;
}

export function isModelPreset(name: string): name is ModelPreset {
  return (MODEL_PRESETS as readonly string[]).includes(name);
}

export function isServingPreset(name: string): name is ServingPreset {
  return (SERVING_PRESETS as readonly string[]).includes(name);
}

export function isMicroPreset(name: string): name is MicroPreset {
  return (MICRO_PRESETS as readonly string[]).includes(name);
}

/** The serving preset whose KV groups a preset has (a micro preset's mini twin; a mini preset itself). */
export function kvTwin(preset: ModelPreset): ServingPreset {
  switch (preset) {
    case 'dsv4-micro':
      return 'dsv4-mini';
    case 'hybrid-micro':
      return 'hybrid-mini';
    case 'llama-micro':
      return 'llama-mini';
    default:
      return preset;
  }
}

/** The dimensions of a preset's cached tensors: the mini presets', and the micro twins' (a 16-wide model). */
interface KVDims {
  latentDim: number;
  ropeDim: number;
  scaleTile: number;
  stateDim: number;
  headSize: number;
  convDim: number;
  ssmStateDim: number;
}

const MINI_DIMS: KVDims = {
  latentDim: 56,
  ropeDim: 8,
  scaleTile: 28,
  stateDim: 20,
  headSize: 16,
  convDim: 64,
  ssmStateDim: 8,
};
const MICRO_DIMS: KVDims = {
  latentDim: 6,
  ropeDim: 2,
  scaleTile: 3,
  stateDim: 2,
  headSize: 2,
  convDim: 8,
  ssmStateDim: 2,
};

/** Block sizes an instance may use (`--block-size`): powers of two from 1 to 256 tokens per page. */
export function isBlockSize(n: unknown): n is number {
  return typeof n === 'number' && Number.isInteger(n) && n >= 1 && n <= 256 && (n & (n - 1)) === 0;
}

/** The preset's KV groups with `blockSize` tokens per page (default BLOCK_SIZE). */
export function presetKVGroups(preset: ModelPreset, blockSize: number = BLOCK_SIZE): KVCacheGroupSpec[] {
  if (!isBlockSize(blockSize))
    throw new HandoffError('BAD_CONFIG', `block size must be a power of two in [1, 256], got ${String(blockSize)}`);
  const d = isMicroPreset(preset) ? MICRO_DIMS : MINI_DIMS;
  // bf16 GQA K/V (hybrid and llama share it).
  const gqa = {
    type: 'full_attention',
    blockSize,
    numKvHeads: 2,
    headSize: d.headSize,
    dtype: 'bf16',
    kvQuantMode: 'none',
  } as const;
  switch (kvTwin(preset)) {
    case 'dsv4-mini':
      return [
        {
          groupId: 0,
          layerNames: ['layers.0.attn', 'layers.1.attn'],
          spec: {
            type: 'mla',
            blockSize,
            latentDim: d.latentDim,
            ropeDim: d.ropeDim,
            scaleTile: d.scaleTile,
            dtype: 'uint8',
            kvQuantMode: 'fp8_ds_mla',
          },
        },
        {
          groupId: 1,
          layerNames: ['layers.0.compressor', 'layers.1.compressor'],
          spec: { type: 'compressor', blockSize, stateDim: d.stateDim, dtype: 'f32', kvQuantMode: 'none' },
        },
      ];
    case 'hybrid-mini':
      return [
        {
          groupId: 0,
          layerNames: ['layers.0.attn', 'layers.2.attn'],
          spec: gqa,
        },
        {
          groupId: 1,
          layerNames: ['layers.1.mamba', 'layers.3.mamba'],
          spec: {
            type: 'mamba',
            blockSize,
            convDim: d.convDim,
            convWidth: 3,
            ssmStateDim: d.ssmStateDim,
            dtype: 'f32',
          },
        },
      ];
    case 'llama-mini':
      return [
        {
          groupId: 0,
          layerNames: ['layers.0.attn', 'layers.1.attn'],
          spec: gqa,
        },
      ];
  }
}
