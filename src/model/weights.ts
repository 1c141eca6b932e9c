/**
 * Seeded synthetic weights (no weights can be downloaded here). Every tensor is drawn from its own
 * SeededRng keyed by (model seed, tensor name), so a tensor does not depend on the order in which the
 * others are built, and two instances with the same seed hold bit-identical weights.
 *
 * Linear layers are uniform with standard deviation 1/sqrt(fanIn); the embedding and the lm head have
 * standard deviation 0.4, which gives logits of a few units after the final RMSNorm: peaked enough
 * that greedy decoding and top-p sampling differ. The lm head is separate: with random weights a tied
 * head mostly predicts the input token again (the residual stream still carries its embedding).
 */
import { SeededRng } from '../util/env.ts';
import type { ModelPreset } from '../kv/presets.ts';
import type { LayerPlan, ModelConfig } from './config.ts';
import type { Linear } from './ops.ts';

export interface MlpWeights {
  norm: Float32Array;
  gate: Linear;
  up: Linear;
  down: Linear;
}

export interface GqaWeights {
  kind: 'gqa';
  norm: Float32Array;
  wq: Linear;
  wk: Linear;
  wv: Linear;
  wo: Linear;
  mlp: MlpWeights;
}

export interface CompressorWeights {
  /** hidden -> compressor state (cached per token). */
  wc: Linear;
  /** hidden -> query over compressor states. */
  wq: Linear;
  /** attended state -> hidden (added to the residual). */
  wo: Linear;
}

export interface MlaWeights {
  kind: 'mla';
  norm: Float32Array;
  /** hidden -> numHeads x (latentDim + ropeDim). */
  wq: Linear;
  /** hidden -> latent (latentDim NoPE + ropeDim RoPE). */
  wkv: Linear;
  kvNorm: Float32Array;
  /** numHeads x latentDim -> hidden. */
  wo: Linear;
  compressor: CompressorWeights;
  mlp: MlpWeights;
}

export interface MambaWeights {
  kind: 'mamba';
  norm: Float32Array;
  wIn: Linear;
  wZ: Linear;
  /** (convWidth + 1) x convDim taps; row convWidth is the current input. */
  conv: Float32Array;
  convBias: Float32Array;
  dtWeight: Float32Array;
  dtBias: Float32Array;
  wB: Linear;
  wC: Linear;
  /** A = -(n + 1) * (1 + noise): convDim x ssmStateDim, negative (a decaying state). */
  aNeg: Float32Array;
  dSkip: Float32Array;
  wOut: Linear;
  mlp: MlpWeights;
}

export type LayerWeights = GqaWeights | MlaWeights | MambaWeights;

export interface ModelWeights {
  /** vocab x hidden. */
  embed: Linear;
  /** vocab x hidden; the same object as `embed` when the config ties them. */
  lmHead: Linear;
  finalNorm: Float32Array;
  layers: LayerWeights[];
}

function nameSeed(seed: number, name: string): number {
  let h = (0x811c9dc5 ^ (seed >>> 0) ^ Math.floor(seed / 4294967296)) >>> 0;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

class WeightMaker {
  constructor(private readonly seed: number) {}

  uniform(name: string, n: number, center: number, halfWidth: number): Float32Array {
    const rng = new SeededRng(nameSeed(this.seed, name));
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = center + (2 * rng.next() - 1) * halfWidth;
    return out;
  }

  /** Uniform with standard deviation std. */
  normalish(name: string, n: number, std: number): Float32Array {
    return this.uniform(name, n, 0, std * Math.sqrt(3));
  }

  linear(name: string, rows: number, cols: number): Linear {
    return { rows, cols, w: this.normalish(name, rows * cols, 1 / Math.sqrt(cols)) };
  }

  norm(name: string, n: number): Float32Array {
    return this.uniform(name, n, 1, 0.1);
  }

  mlp(p: string, cfg: ModelConfig): MlpWeights {
    return {
      norm: this.norm(`${p}.mlp_norm`, cfg.hidden),
      gate: this.linear(`${p}.mlp.gate`, cfg.mlpHidden, cfg.hidden),
      up: this.linear(`${p}.mlp.up`, cfg.mlpHidden, cfg.hidden),
      down: this.linear(`${p}.mlp.down`, cfg.hidden, cfg.mlpHidden),
    };
  }

  /** Whole weights (every shard's): a plan's cache specs are one rank's share, so split sizes are scaled by TP. */
  layer(plan: LayerPlan, cfg: ModelConfig): LayerWeights {
    const p = `layers.${plan.index}`;
    const h = cfg.hidden;
    const tp = cfg.tensorParallelSize;
    switch (plan.kind) {
      case 'gqa': {
        const headSize = plan.cache.spec.headSize;
        const numKvHeads = plan.cache.spec.numKvHeads * tp;
        return {
          kind: 'gqa',
          norm: this.norm(`${p}.attn_norm`, h),
          wq: this.linear(`${p}.attn.wq`, plan.numHeads * headSize, h),
          wk: this.linear(`${p}.attn.wk`, numKvHeads * headSize, h),
          wv: this.linear(`${p}.attn.wv`, numKvHeads * headSize, h),
          wo: this.linear(`${p}.attn.wo`, h, plan.numHeads * headSize),
          mlp: this.mlp(p, cfg),
        };
      }
      case 'mla': {
        const { latentDim, ropeDim } = plan.cache.spec;
        const stateDim = plan.compressor.spec.stateDim * tp;
        return {
          kind: 'mla',
          norm: this.norm(`${p}.attn_norm`, h),
          wq: this.linear(`${p}.attn.wq`, plan.numHeads * (latentDim + ropeDim), h),
          wkv: this.linear(`${p}.attn.wkv`, latentDim + ropeDim, h),
          kvNorm: this.norm(`${p}.attn.kv_norm`, latentDim),
          wo: this.linear(`${p}.attn.wo`, h, plan.numHeads * latentDim),
          compressor: {
            wc: this.linear(`${p}.compressor.wc`, stateDim, h),
            wq: this.linear(`${p}.compressor.wq`, stateDim, h),
            wo: this.linear(`${p}.compressor.wo`, h, stateDim),
          },
          mlp: this.mlp(p, cfg),
        };
      }
      case 'mamba': {
        const { convWidth, ssmStateDim: n } = plan.cache.spec;
        const d = plan.cache.spec.convDim * tp;
        const aNoise = this.uniform(`${p}.mamba.a_noise`, d * n, 1, 0.2);
        const aNeg = new Float32Array(d * n);
        for (let i = 0; i < d * n; i++) aNeg[i] = -((i % n) + 1) * (aNoise[i] as number);
        return {
          kind: 'mamba',
          norm: this.norm(`${p}.mamba_norm`, h),
          wIn: this.linear(`${p}.mamba.w_in`, d, h),
          wZ: this.linear(`${p}.mamba.w_z`, d, h),
          conv: this.normalish(`${p}.mamba.conv`, (convWidth + 1) * d, 0.5),
          convBias: this.normalish(`${p}.mamba.conv_bias`, d, 0.1),
          dtWeight: this.normalish(`${p}.mamba.dt_weight`, d, 0.5),
          // softplus(-3 +- 1): time steps of about 0.02..0.13.
          dtBias: this.uniform(`${p}.mamba.dt_bias`, d, -3, 1),
          wB: this.linear(`${p}.mamba.w_b`, n, d),
          wC: this.linear(`${p}.mamba.w_c`, n, d),
          aNeg,
          dSkip: this.uniform(`${p}.mamba.d_skip`, d, 1, 0.1),
          wOut: this.linear(`${p}.mamba.w_out`, h, d),
          mlp: this.mlp(p, cfg),
        };
      }
    }
  }
}

export function buildWeights(cfg: ModelConfig, seed: number): ModelWeights {
  const m = new WeightMaker(seed);
  const embed: Linear = {
    rows: cfg.vocabSize,
    cols: cfg.hidden,
    w: m.normalish('embed', cfg.vocabSize * cfg.hidden, 0.4),
  };
  const lmHead: Linear = cfg.tiedEmbeddings
    ? embed
    : { rows: cfg.vocabSize, cols: cfg.hidden, w: m.normalish('lm_head', cfg.vocabSize * cfg.hidden, 0.4) };
  return {
    embed,
    lmHead,
    finalNorm: m.norm('final_norm', cfg.hidden),
    layers: cfg.layers.map((plan) => m.layer(plan, cfg)),
  };
}

/** Weights are immutable (and whole at any TP), so instances of one (preset, seed) in a process share them. */
const CACHE_MAX = 4;
const cache = new Map<string, ModelWeights>();

export function modelWeights(preset: ModelPreset, cfg: ModelConfig, seed: number): ModelWeights {
  const key = `${preset}:${seed}`;
  const hit = cache.get(key);
  if (hit) return hit;
  const w = buildWeights(cfg, seed);
  if (cache.size >= CACHE_MAX) cache.delete(cache.keys().next().value as string);
  cache.set(key, w);
  return w;
}
