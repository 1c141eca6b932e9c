/**
 * KV cache groups of the three model presets (DESIGN.md §5). The model layer builds its layers from
 * these same groups, so cache and model cannot disagree.
 *
 *   dsv4-mini:   MLA fp8 (uint8) pages + compressor f32 pages  -> mixed precision, zeroing, no Mamba
 *   hybrid-mini: bf16 attention + Mamba conv/SSM f32 state     -> Mamba, zeroing
 *   llama-mini:  bf16 GQA only                                  -> uniform, no zeroing
 */
import type { KVCacheGroupSpec } from './spec.ts';

export const MODEL_PRESETS = ['dsv4-mini', 'hybrid-mini', 'llama-mini'] as const;
export type ModelPreset = (typeof MODEL_PRESETS)[number];

export const BLOCK_SIZE = 16;

export function isModelPreset(name: string): name is ModelPreset {
  return (MODEL_PRESETS as readonly string[]).includes(name);
}

export function presetKVGroups(preset: ModelPreset): KVCacheGroupSpec[] {
  switch (preset) {
    case 'dsv4-mini':
      return [
        {
          groupId: 0,
          layerNames: ['layers.0.attn', 'layers.1.attn'],
          spec: {
            type: 'mla',
            blockSize: BLOCK_SIZE,
            latentDim: 56,
            ropeDim: 8,
            scaleTile: 28,
            dtype: 'uint8',
            kvQuantMode: 'fp8_ds_mla',
          },
        },
        {
          groupId: 1,
          layerNames: ['layers.0.compressor', 'layers.1.compressor'],
          spec: { type: 'compressor', blockSize: BLOCK_SIZE, stateDim: 20, dtype: 'f32', kvQuantMode: 'none' },
        },
      ];
    case 'hybrid-mini':
      return [
        {
          groupId: 0,
          layerNames: ['layers.0.attn', 'layers.2.attn'],
          spec: {
            type: 'full_attention',
            blockSize: BLOCK_SIZE,
            numKvHeads: 2,
            headSize: 16,
            dtype: 'bf16',
            kvQuantMode: 'none',
          },
        },
        {
          groupId: 1,
          layerNames: ['layers.1.mamba', 'layers.3.mamba'],
          spec: { type: 'mamba', blockSize: BLOCK_SIZE, convDim: 64, convWidth: 3, ssmStateDim: 8, dtype: 'f32' },
        },
      ];
    case 'llama-mini':
      return [
        {
          groupId: 0,
          layerNames: ['layers.0.attn', 'layers.1.attn'],
          spec: {
            type: 'full_attention',
            blockSize: BLOCK_SIZE,
            numKvHeads: 2,
            headSize: 16,
            dtype: 'bf16',
            kvQuantMode: 'none',
          },
        },
      ];
  }
}
