/**
 * A tiny real transformer over the paged KV cache: embedding, layers (GQA attention, MLA + compressor,
 * or Mamba, each with an MLP), final RMSNorm, lm head, sampler.
 *
 * `forward(args, slabs)` computes each request on its own, one after the other (batch invariance by
 * construction), reading and writing the cache only through the requests' block tables. Its output
 * depends only on the token ids, positions, weights and the bytes of the pages in the tables, so a
 * prompt computed in one chunk or several, or whose pages were copied byte for byte from another
 * instance, gives bit-identical logits.
 */
import { assert } from '../util/assert.ts';
import { isModelPreset, type ModelPreset } from '../kv/presets.ts';
import type { KVCacheConfig } from '../kv/spec.ts';
import type { KernelRanks } from '../device/types.ts';
import type { Chunk } from './attention.ts';
import { modelConfig, type ModelConfig } from './config.ts';
import { GqaLayer } from './gqa.ts';
import { MambaLayer } from './mamba.ts';
import { MlaLayer } from './mla.ts';
import { matVec, rmsNorm, Scratch, type FlopCounter, type Linear } from './ops.ts';
import { Parallel, rowsOf, shardRange } from './parallel.ts';
import { argmax, hasNaN, logitsHash, sampleToken } from './sampler.ts';
import type { ForwardArgs, ForwardOutput, ForwardRequest, ForwardResult } from './types.ts';
import { modelWeights, type ModelWeights } from './weights.ts';

type Layer = GqaLayer | MlaLayer | MambaLayer;

export interface Model {
  readonly config: ModelConfig;
  /** Floating point operations executed so far (for the benchmark). */
  readonly counter: FlopCounter;
  forward(args: ForwardArgs, slabs: Uint8Array[]): ForwardResult;
}

/** Bounds on one forward, so a corrupted op cannot make the kernel loop without end. */
export const MAX_TOKENS_PER_REQUEST_STEP = 65536;
export const MAX_REQUESTS_PER_STEP = 4096;

class TinyTransformer implements Model {
  readonly counter: FlopCounter = { flops: 0 };
  private readonly layers: Layer[];
  private readonly logits: Float32Array;
  private readonly finalHidden: Float64Array;
  /** The lm head's rows of each local shard (vocabulary-parallel: logits are gathered, never summed). */
  private readonly lmHeadShards: Linear[];
  /** Logits per shard in the gather: the largest shard's rows. */
  private readonly vocabPerShard: number;
  private readonly localLogits = new Scratch();

  constructor(
    readonly config: ModelConfig,
    private readonly kvConfig: KVCacheConfig,
    private readonly weights: ModelWeights,
    private readonly par: Parallel,
  ) {
    this.layers = config.layers.map((plan, i): Layer => {
      const w = weights.layers[i];
      if (plan.kind === 'gqa' && w?.kind === 'gqa') return new GqaLayer(config, plan.cache, plan.numHeads, w, par);
      if (plan.kind === 'mla' && w?.kind === 'mla')
        return new MlaLayer(config, plan.cache, plan.compressor, plan.numHeads, w, par);
      if (plan.kind === 'mamba' && w?.kind === 'mamba') return new MambaLayer(config, plan.cache, w, par);
      assert(false, `layer ${i}: weights do not match the plan`);
    });
    this.logits = new Float32Array(config.vocabSize);
    this.finalHidden = new Float64Array(config.hidden);
    this.vocabPerShard = Math.ceil(config.vocabSize / par.shards);
    this.lmHeadShards = par.localShards.map((s) =>
      rowsOf(weights.lmHead, ...shardRange(config.vocabSize, par.shards, s)),
    );
  }

  forward(args: ForwardArgs, slabs: Uint8Array[]): ForwardResult {
    checkArgs(args, this.kvConfig);
    this.checkSlabs(slabs);
    return { outputs: args.requests.map((req) => this.forwardOne(req, slabs)) };
  }

  private checkSlabs(slabs: Uint8Array[]): void {
    const { numSlabs, numBlocks, pageBytes } = this.kvConfig;
    assert(slabs.length === numSlabs, () => `expected ${numSlabs} slabs, got ${slabs.length}`);
    for (const s of slabs)
      assert(
        s.byteLength === numBlocks * pageBytes,
        () => `slab of ${s.byteLength} bytes, expected ${numBlocks * pageBytes}`,
      );
  }

  private forwardOne(req: ForwardRequest, slabs: Uint8Array[]): ForwardOutput {
    const { config: cfg, weights } = this;
    const H = cfg.hidden;
    const embed = weights.embed.w;
    const hidden = req.tokenIds.map((id) => {
      if (!(Number.isInteger(id) && id >= 0 && id < cfg.vocabSize))
        assert(false, `token id ${id} out of the vocabulary`);
      const h = new Float64Array(H);
      for (let d = 0, k = id * H; d < H; d++, k++) h[d] = embed[k] as number;
      return h;
    });
    const chunk: Chunk = { startPos: req.startPos, hidden, blockTables: req.blockTables };
    for (const layer of this.layers) layer.forward(chunk, slabs, this.counter);
    if (!req.sample)
      return { requestId: req.requestId, tokenId: null, logprob: null, logitsHash: null, nanLogits: false };
    const last = hidden[hidden.length - 1] as Float64Array;
    rmsNorm(last, 0, cfg.hidden, weights.finalNorm, cfg.rmsEps, this.finalHidden, 0);
    this.computeLogits();
    // A rank thread other than rank 0 only needs the token (the device returns rank 0's output): a greedy
    // token is the argmax (sampleToken's, NaN or not), without the log-probability or the logits' hash.
    if (!this.par.ranks.includes(0)) {
      const tokenId =
        req.sampling.temperature === 0 ? argmax(this.logits) : sampleToken(this.logits, req.sampling).tokenId;
      return { requestId: req.requestId, tokenId, logprob: null, logitsHash: null, nanLogits: hasNaN(this.logits) };
    }
    const s = sampleToken(this.logits, req.sampling);
    return {
      requestId: req.requestId,
      tokenId: s.tokenId,
      logprob: s.logprob,
      logitsHash: logitsHash(this.logits),
      nanLogits: s.nanLogits,
    };
  }

  /** Each local shard's rows of the lm head, gathered into the logits (f32, as the TP=1 product stored them). */
  private computeLogits(): void {
    const { par, vocabPerShard: per } = this;
    const local = this.localLogits.get(this.lmHeadShards.length * per);
    this.lmHeadShards.forEach((lin, k) => matVec(lin, this.finalHidden, 0, local, k * per, this.counter));
    const all = par.gather(local, per);
    for (let s = 0; s < par.shards; s++) {
      const [r0, r1] = shardRange(this.config.vocabSize, par.shards, s);
      this.logits.set(all.subarray(s * per, s * per + (r1 - r0)), r0);
    }
  }
}

/** Shape checks on args that crossed a thread boundary as `unknown` (programmer errors if wrong). */
export function checkArgs(args: ForwardArgs, kvConfig: KVCacheConfig): void {
  assert(
    typeof args === 'object' && args !== null && Array.isArray(args.requests),
    'forward args need a requests array',
  );
  assert(args.requests.length <= MAX_REQUESTS_PER_STEP, `more than ${MAX_REQUESTS_PER_STEP} requests in one step`);
  const ids = new Set<string>();
  for (const r of args.requests) {
    assert(typeof r.requestId === 'string' && !ids.has(r.requestId), `duplicate or missing request id ${r.requestId}`);
    ids.add(r.requestId);
    assert(Array.isArray(r.tokenIds) && r.tokenIds.length > 0, `${r.requestId}: a forward computes at least one token`);
    assert(r.tokenIds.length <= MAX_TOKENS_PER_REQUEST_STEP, `${r.requestId}: chunk too long`);
    assert(Number.isInteger(r.startPos) && r.startPos >= 0, `${r.requestId}: bad startPos ${r.startPos}`);
    assert(
      Array.isArray(r.blockTables) && r.blockTables.length === kvConfig.groups.length,
      `${r.requestId}: one block table per KV group`,
    );
    assert(
      typeof r.sample === 'boolean' && typeof r.sampling === 'object' && r.sampling !== null,
      `${r.requestId}: bad sampling`,
    );
  }
}

/**
 * `ranks`: which of the cache's tensorParallelSize ranks this instance computes, and how it reaches the
 * others (a device's KernelRanks); default: all of them, here.
 */
export function createModel(preset: ModelPreset, seed: number, kvConfig: KVCacheConfig, ranks?: KernelRanks): Model {
  assert(isModelPreset(preset), `unknown model preset ${String(preset)}`);
  assert(Number.isFinite(seed), 'model seed must be a finite number');
  const cfg = modelConfig(preset, kvConfig);
  const par = new Parallel(kvConfig.tensorParallelSize, kvConfig.numLayerSlabs, ranks);
  return new TinyTransformer(cfg, kvConfig, modelWeights(preset, cfg, seed), par);
}
