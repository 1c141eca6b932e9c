/**
 * bf16 grouped-query attention (K/V per KV head in the page) + MLP, split over tensor parallel ranks.
 *
 * Rank r holds KV heads [r*Hkv/TP, (r+1)*Hkv/TP) in its own slab (its page has the TP=1 layout of its
 * heads only, kv/spec.ts) and computes the query heads that attend to them: wq, wk, wv are column-parallel
 * (rows by head). wo is row-parallel: each shard's query heads give one partial sum, reduced in shard
 * order (parallel.ts), then the MLP.
 */
import type { GqaWeights } from './weights.ts';
import type { CachePlace, ModelConfig } from './config.ts';
import type { FullAttentionSpec } from '../kv/spec.ts';
import { attendSlots, blockTable, withTailBound, type Chunk, type SlotSet } from './attention.ts';
import { matVec, rmsNorm, rope, Scratch, type FlopCounter, type Linear } from './ops.ts';
import { readKvPages, slotLocation, writeKvSlot } from './pages.ts';
import { ParallelMlp } from './mlp.ts';
import { addReduced, colsOf, rowsOf, type Parallel } from './parallel.ts';

/** One local rank's weights: its query and KV heads' rows, and each of its shards' wo columns. */
interface GqaRank {
  rank: number;
  wq: Linear;
  wk: Linear;
  wv: Linear;
  wo: Linear[];
}

export class GqaLayer {
  private readonly ranks: GqaRank[];
  private readonly mlp: ParallelMlp;
  /** Query heads per rank. */
  private readonly rankHeads: number;
  private readonly norm: Float32Array;
  private readonly xn = new Scratch();
  private readonly q = new Scratch();
  private readonly kv = new Scratch();
  private readonly keys = new Scratch();
  private readonly values = new Scratch();
  private readonly probs = new Scratch();
  private readonly att = new Scratch();
  private readonly bounds = new Scratch();
  private readonly partials = new Scratch();

  constructor(
    private readonly cfg: ModelConfig,
    /** The cache of one rank (its share of the KV heads). */
    private readonly cache: CachePlace<FullAttentionSpec>,
    numHeads: number,
    w: GqaWeights,
    private readonly par: Parallel,
  ) {
    const D = cache.spec.headSize;
    const kvRows = cache.spec.numKvHeads * D;
    this.norm = w.norm;
    this.rankHeads = numHeads / par.size;
    const qRows = this.rankHeads * D;
    const shardCols = qRows / par.shardsPerRank;
    this.ranks = par.ranks.map((rank) => ({
      rank,
      wq: rowsOf(w.wq, rank * qRows, (rank + 1) * qRows),
      wk: rowsOf(w.wk, rank * kvRows, (rank + 1) * kvRows),
      wv: rowsOf(w.wv, rank * kvRows, (rank + 1) * kvRows),
      wo: par.shardsOf(rank).map((s) => colsOf(w.wo, s * shardCols, (s + 1) * shardCols)),
    }));
    this.mlp = new ParallelMlp(w.mlp, cfg, par);
  }

  forward(chunk: Chunk, slabs: Uint8Array[], fc: FlopCounter): void {
    const { cfg, par } = this;
    const n = chunk.hidden.length;
    const width = cfg.hidden;
    const xn = this.xn.get(n * width);
    chunk.hidden.forEach((h, t) => rmsNorm(h, 0, width, this.norm, cfg.rmsEps, xn, t * width));
    const partials = this.partials.get(par.localShards.length * n * width);
    this.ranks.forEach((r, i) => this.rankForward(r, chunk, xn, slabs, partials, i * par.shardsPerRank, fc));
    addReduced(chunk.hidden, par.gather(partials, n * width), par.shards, width);
    this.mlp.apply(chunk.hidden, fc);
  }

  /** Rank r's heads: write this chunk's K/V to r's pages, read r's pages back, attend, wo partials per shard. */
  private rankForward(
    r: GqaRank,
    chunk: Chunk,
    xn: Float64Array,
    slabs: Uint8Array[],
    partials: Float64Array,
    firstLocalShard: number,
    fc: FlopCounter,
  ): void {
    const { cfg, cache } = this;
    const spec = cache.spec;
    const slab = slabs[this.par.slabOf(r.rank, cache.slab)] as Uint8Array;
    const table = blockTable(chunk, cache.group);
    const D = spec.headSize;
    const kvDim = spec.numKvHeads * D;
    const qDim = this.rankHeads * D;
    const n = chunk.hidden.length;
    const width = cfg.hidden;
    const q = this.q.get(n * qDim);
    const kv = this.kv.get(2 * kvDim);
    // 1. This chunk's K/V of r's heads: project, rotate, write into their slots.
    for (let i = 0; i < n; i++) {
      const pos = chunk.startPos + i;
      matVec(r.wq, xn, i * width, q, i * qDim, fc);
      matVec(r.wk, xn, i * width, kv, 0, fc);
      matVec(r.wv, xn, i * width, kv, kvDim, fc);
      for (let h = 0; h < this.rankHeads; h++) rope(q, i * qDim + h * D, D, pos, cfg.ropeTheta);
      for (let h = 0; h < spec.numKvHeads; h++) rope(kv, h * D, D, pos, cfg.ropeTheta);
      const { block, slot } = slotLocation(table, spec.blockSize, pos, cfg.numBlocks);
      writeKvSlot(slab, spec, cfg.pageBytes, block, slot, kv, 0, kv, kvDim);
    }
    // 2. Read r's whole pages back (the chunk's own K/V included, quantized to bf16) and attend.
    const sets = this.readSets(slab, table);
    const att = this.att.get(qDim);
    const group = this.rankHeads / spec.numKvHeads;
    const scale = 1 / Math.sqrt(D);
    const shardCols = qDim / r.wo.length;
    const probs = this.probs.get(table.length * spec.blockSize);
    for (let i = 0; i < n; i++) {
      const pos = chunk.startPos + i;
      for (let h = 0; h < this.rankHeads; h++) {
        const set = sets[Math.floor(h / group)] as SlotSet;
        attendSlots(q, i * qDim + h * D, D, set, D, pos, scale, probs, att, h * D, fc);
      }
      r.wo.forEach((wo, k) => matVec(wo, att, k * shardCols, partials, ((firstLocalShard + k) * n + i) * width, fc));
    }
  }

  /** Decode every slot of r's pages in the table: one slot set per KV head of the rank. */
  private readSets(slab: Uint8Array, table: readonly number[]): SlotSet[] {
    const spec = this.cache.spec;
    const D = spec.headSize;
    const kvDim = spec.numKvHeads * D;
    const slots = table.length * spec.blockSize;
    const keys = this.keys.get(slots * kvDim);
    const values = this.values.get(slots * kvDim);
    readKvPages(slab, spec, this.cfg.pageBytes, table, keys, values);
    const bounds = this.bounds.get(spec.numKvHeads * (slots + 1));
    return Array.from({ length: spec.numKvHeads }, (_, kvh) =>
      withTailBound(
        { numSlots: slots, keys, kStride: kvDim, kOff: kvh * D, values, vStride: kvDim, vOff: kvh * D },
        D,
        D,
        bounds.subarray(kvh * (slots + 1), (kvh + 1) * (slots + 1)),
      ),
    );
  }
}
