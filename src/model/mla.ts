/**
 * The dsv4-mini layer: MLA-style attention over an fp8 latent cache, a compressor branch over an f32
 * state cache, and an MLP.
 *
 * One latent "KV head" per token: latent = [ NoPE part (latentDim, RMS-normed) | RoPE part (ropeDim,
 * rotated by position) ]. It is written into the MLA group's page as fp8 e4m3 with per-tile f32
 * scales plus the bf16 rope part (spec.ts layout), then read back, whole pages, dequantized. The
 * query heads attend to it: keys = the whole latent, values = its NoPE part (absorbed-MLA style),
 * output projection from numHeads x latentDim to hidden.
 *
 * Tensor parallel: the latent is replicated (every rank computes it and writes it to its own pages, and
 * each rank's query heads read that rank's copy, as in vLLM); query heads are split (wq column-parallel),
 * wo is row-parallel. A shard's partial is its heads' wo product plus its compressor head's (compressor.ts).
 */
import type { CompressorSpec, MLAAttentionSpec } from '../kv/spec.ts';
import type { CachePlace, ModelConfig } from './config.ts';
import type { MlaWeights } from './weights.ts';
import { attendSlots, blockTable, withTailBound, type Chunk } from './attention.ts';
import { CompressorBranch } from './compressor.ts';
import { ParallelMlp } from './mlp.ts';
import { matVec, rmsNorm, rope, Scratch, type FlopCounter, type Linear } from './ops.ts';
import { readLatentPages, slotLocation, writeLatentSlot } from './pages.ts';
import { addReduced, colsOf, rowsOf, type Parallel } from './parallel.ts';

interface MlaRank {
  rank: number;
  wq: Linear;
  wo: Linear[];
}

export class MlaLayer {
  private readonly ranks: MlaRank[];
  private readonly rankHeads: number;
  private readonly mlp: ParallelMlp;
  private readonly xn = new Scratch();
  private readonly lat = new Scratch();
  private readonly q = new Scratch();
  private readonly keys = new Scratch();
  private readonly probs = new Scratch();
  private readonly att = new Scratch();
  private readonly comp = new Scratch();
  private readonly bound = new Scratch();
  private readonly partials = new Scratch();
  private readonly compressor: CompressorBranch;
  private readonly compressorGroup: number;

  constructor(
    private readonly cfg: ModelConfig,
    private readonly cache: CachePlace<MLAAttentionSpec>,
    compressorCache: CachePlace<CompressorSpec>,
    numHeads: number,
    private readonly w: MlaWeights,
    private readonly par: Parallel,
  ) {
    this.compressor = new CompressorBranch(cfg, compressorCache, w.compressor, par);
    this.compressorGroup = compressorCache.group;
    const { latentDim: L, ropeDim } = cache.spec;
    this.rankHeads = numHeads / par.size;
    const qRows = this.rankHeads * (L + ropeDim);
    const shardCols = (this.rankHeads / par.shardsPerRank) * L;
    this.ranks = par.ranks.map((rank) => ({
      rank,
      wq: rowsOf(w.wq, rank * qRows, (rank + 1) * qRows),
      wo: par.shardsOf(rank).map((s) => colsOf(w.wo, s * shardCols, (s + 1) * shardCols)),
    }));
    this.mlp = new ParallelMlp(w.mlp, cfg, par);
  }

  forward(chunk: Chunk, slabs: Uint8Array[], fc: FlopCounter): void {
    const { cfg, cache, w, par } = this;
    const spec = cache.spec;
    const L = spec.latentDim;
    const dim = L + spec.ropeDim;
    const n = chunk.hidden.length;
    const width = cfg.hidden;
    // 1. The chunk's latents (replicated: every rank computes the same ones).
    const xn = this.xn.get(n * width);
    const lat = this.lat.get(n * dim);
    for (let i = 0; i < n; i++) {
      rmsNorm(chunk.hidden[i] as Float64Array, 0, width, w.norm, cfg.rmsEps, xn, i * width);
      matVec(w.wkv, xn, i * width, lat, i * dim, fc);
      rmsNorm(lat, i * dim, L, w.kvNorm, cfg.rmsEps, lat, i * dim);
      rope(lat, i * dim + L, spec.ropeDim, chunk.startPos + i, cfg.ropeTheta);
    }
    const partials = this.partials.get(par.localShards.length * n * width);
    this.ranks.forEach((r, ri) => this.rankForward(r, ri, chunk, xn, lat, slabs, partials, fc));
    addReduced(chunk.hidden, par.gather(partials, n * width), par.shards, width);
    this.mlp.apply(chunk.hidden, fc);
  }

  /** Rank r: write the latents and compressor states to r's pages, read them back, attend with r's heads. */
  private rankForward(
    r: MlaRank,
    ri: number,
    chunk: Chunk,
    xn: Float64Array,
    lat: Float64Array,
    slabs: Uint8Array[],
    partials: Float64Array,
    fc: FlopCounter,
  ): void {
    const { cfg, cache } = this;
    const spec = cache.spec;
    const slab = slabs[this.par.slabOf(r.rank, cache.slab)] as Uint8Array;
    const table = blockTable(chunk, cache.group);
    const compTable = blockTable(chunk, this.compressorGroup);
    const L = spec.latentDim;
    const dim = L + spec.ropeDim;
    const n = chunk.hidden.length;
    const width = cfg.hidden;
    const qDim = this.rankHeads * dim;
    const q = this.q.get(n * qDim);
    for (let i = 0; i < n; i++) {
      const pos = chunk.startPos + i;
      matVec(r.wq, xn, i * width, q, i * qDim, fc);
      for (let h = 0; h < this.rankHeads; h++) rope(q, i * qDim + h * dim + L, spec.ropeDim, pos, cfg.ropeTheta);
      const { block, slot } = slotLocation(table, spec.blockSize, pos, cfg.numBlocks);
      writeLatentSlot(slab, spec, cfg.pageBytes, block, slot, lat, i * dim);
      this.compressor.writeToken(ri, compTable, slabs, i, n, pos, xn, i * width, fc);
    }
    // Read whole pages of both groups back (own tokens included, as stored) and attend.
    const slots = table.length * spec.blockSize;
    const keys = this.keys.get(slots * dim);
    readLatentPages(slab, spec, cfg.pageBytes, table, keys);
    this.compressor.readPages(ri, compTable, slabs);
    const set = withTailBound(
      { numSlots: slots, keys, kStride: dim, kOff: 0, values: keys, vStride: dim, vOff: 0 },
      dim,
      L,
      this.bound.get(slots + 1),
    );
    const att = this.att.get(this.rankHeads * L);
    const comp = this.comp.get(width);
    const scale = 1 / Math.sqrt(dim);
    const shardCols = (this.rankHeads * L) / r.wo.length;
    const probs = this.probs.get(slots);
    for (let i = 0; i < n; i++) {
      const pos = chunk.startPos + i;
      for (let h = 0; h < this.rankHeads; h++)
        attendSlots(q, i * qDim + h * dim, dim, set, L, pos, scale, probs, att, h * L, fc);
      r.wo.forEach((wo, k) => {
        const off = ((ri * r.wo.length + k) * n + i) * width;
        matVec(wo, att, k * shardCols, partials, off, fc);
        this.compressor.attend(ri, k, i, pos, comp, 0, fc);
        for (let d = 0; d < width; d++) partials[off + d] = (partials[off + d] as number) + (comp[d] as number);
      });
    }
  }
}
