/**
 * The compressor branch of a dsv4-mini layer (DeepSeek-V4's compressor state cache, scaled down): each
 * token's hidden state is compressed to a stateDim f32 vector that is CACHED in the compressor group's
 * page (group 1), then read back through that group's block table, whole pages, and attended over
 * (keys = values = the cached states). The result is added to the residual, so the compressor pages
 * influence the output just as the MLA pages do.
 *
 * The state has TP_SHARDS heads of stateDim / S values each (one per shard): rank r caches the states of
 * its shards' heads in its own pages (kv/spec.ts rankSpec) and attends with them; wc and wq are
 * column-parallel, wo row-parallel (a partial sum per shard, reduced with the attention's in parallel.ts).
 */
import type { CompressorSpec } from '../kv/spec.ts';
import type { CachePlace, ModelConfig } from './config.ts';
import type { CompressorWeights } from './weights.ts';
import { assert } from '../util/assert.ts';
import { attendSlots, withTailBound, type SlotSet } from './attention.ts';
import { matVec, Scratch, type FlopCounter, type Linear } from './ops.ts';
import { readStatePages, slotLocation, writeStateSlot } from './pages.ts';
import { colsOf, rowsOf, type Parallel } from './parallel.ts';

interface CompressorRank {
  rank: number;
  wc: Linear;
  wq: Linear;
  /** Per shard of the rank: its head's columns of wo. */
  wo: Linear[];
}

export class CompressorBranch {
  private readonly ranks: CompressorRank[];
  /** Values per head. */
  private readonly headDim: number;
  private readonly queries = new Scratch();
  private readonly state = new Scratch();
  private readonly states = new Scratch();
  private readonly probs = new Scratch();
  private readonly bound = new Scratch();
  /** One head's attention output. */
  private readonly att: Float64Array;
  /** The slot sets (one per head) of the rank whose pages were read last. */
  private sets: SlotSet[] | null = null;

  constructor(
    private readonly cfg: ModelConfig,
    /** One rank's compressor cache (its heads' states). */
    private readonly cache: CachePlace<CompressorSpec>,
    w: CompressorWeights,
    private readonly par: Parallel,
  ) {
    const rankDim = cache.spec.stateDim;
    this.headDim = rankDim / par.shardsPerRank;
    assert(Number.isInteger(this.headDim) && this.headDim >= 1, 'compressor heads must split the state evenly');
    const hd = this.headDim;
    this.att = new Float64Array(hd);
    this.ranks = par.ranks.map((rank) => ({
      rank,
      wc: rowsOf(w.wc, rank * rankDim, (rank + 1) * rankDim),
      wq: rowsOf(w.wq, rank * rankDim, (rank + 1) * rankDim),
      wo: par.shardsOf(rank).map((s) => colsOf(w.wo, s * hd, (s + 1) * hd)),
    }));
  }

  /** Compress token i (normed input at xn[xnOff ..]) for the rank's heads into its slot; keep its query. */
  writeToken(
    rankIndex: number,
    table: readonly number[],
    slabs: Uint8Array[],
    i: number,
    numTokens: number,
    pos: number,
    xn: Float64Array,
    xnOff: number,
    fc: FlopCounter,
  ): void {
    const { spec } = this.cache;
    const r = this.ranks[rankIndex] as CompressorRank;
    const sd = spec.stateDim;
    const state = this.state.get(sd);
    matVec(r.wc, xn, xnOff, state, 0, fc);
    matVec(r.wq, xn, xnOff, this.queries.get(numTokens * sd), i * sd, fc);
    const { block, slot } = slotLocation(table, spec.blockSize, pos, this.cfg.numBlocks);
    const slab = slabs[this.par.slabOf(r.rank, this.cache.slab)] as Uint8Array;
    writeStateSlot(slab, spec, this.cfg.pageBytes, block, slot, state, 0);
  }

  /** Decode every slot of every compressor page of the rank in the table (after its writeToken calls). */
  readPages(rankIndex: number, table: readonly number[], slabs: Uint8Array[]): void {
    const { spec } = this.cache;
    const r = this.ranks[rankIndex] as CompressorRank;
    const sd = spec.stateDim;
    const hd = this.headDim;
    const out = this.states.get(table.length * spec.blockSize * sd);
    const slab = slabs[this.par.slabOf(r.rank, this.cache.slab)] as Uint8Array;
    const numSlots = readStatePages(slab, spec, this.cfg.pageBytes, table, out);
    const bound = this.bound.get(r.wo.length * (numSlots + 1));
    this.sets = r.wo.map((_, k) =>
      withTailBound(
        { numSlots, keys: out, kStride: sd, kOff: k * hd, values: out, vStride: sd, vOff: k * hd },
        hd,
        hd,
        bound.subarray(k * (numSlots + 1), (k + 1) * (numSlots + 1)),
      ),
    );
  }

  /** out[outOff ..+hidden) = wo_s . attention of token i's query of head k (shard k of the rank) over its states. */
  attend(
    rankIndex: number,
    k: number,
    i: number,
    pos: number,
    out: Float64Array,
    outOff: number,
    fc: FlopCounter,
  ): void {
    const sd = this.cache.spec.stateDim;
    const hd = this.headDim;
    const set = this.sets?.[k];
    assert(set !== undefined, 'compressor: attend before readPages');
    const att = this.att;
    const q = this.queries.get(0);
    attendSlots(q, i * sd + k * hd, hd, set, hd, pos, 1 / Math.sqrt(hd), this.probs.get(set.numSlots), att, 0, fc);
    matVec((this.ranks[rankIndex] as CompressorRank).wo[k] as Linear, att, 0, out, outOff, fc);
  }
}
