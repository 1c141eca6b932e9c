/**
 * Tensor parallelism inside the model, Megatron style, with ONE reduction order for every degree.
 *
 * The model is cut into TP_SHARDS (S) shards: query and KV heads, compressor heads, MLP and Mamba channels,
 * vocabulary rows. A degree TP divides S; rank r computes shards [r*S/TP, (r+1)*S/TP). Column-parallel
 * products (rows of a weight split by shard) need no reduction: each output row is the same dot product
 * whichever rank computes it. Row-parallel products (the contraction split by shard: attention and
 * compressor output, MLP down, Mamba B/C and out) produce one partial sum PER SHARD, and
 *
 *   reduced = ((p_0 + p_1) + ... + p_{S-1})        in shard order, then   h = h + reduced
 *
 * whether the partials came from one rank (TP=1 computes both shards itself) or from several (gathered over
 * shared memory). Float addition is not associative; this order never depends on TP, so TP=1 and TP=2 give
 * the same bits. The exchange is an all-gather (RankCollective.allGather): the device only moves bytes,
 * the arithmetic happens here, identically on every rank, so every rank holds the same residual.
 *
 *   partials [local shard][values]  --allGather-->  [shard 0 | shard 1 | ...]  --reduce in order-->  h += r
 */
import { assert } from '../util/assert.ts';
import type { KernelRanks, RankCollective } from '../device/types.ts';
import { TP_SHARDS } from '../kv/presets.ts';
import type { Linear } from './ops.ts';
import { Scratch } from './ops.ts';

/** Rows [r0, r1) of a row-major weight (a view: column-parallel products read it in place). */
export function rowsOf(lin: Linear, r0: number, r1: number): Linear {
  assert(r0 >= 0 && r0 < r1 && r1 <= lin.rows, `rows [${r0}, ${r1}) out of a ${lin.rows}-row weight`);
  return { rows: r1 - r0, cols: lin.cols, w: lin.w.subarray(r0 * lin.cols, r1 * lin.cols) };
}

/** Columns [c0, c1) of a row-major weight, copied (a row-parallel shard's slice of the contraction). */
export function colsOf(lin: Linear, c0: number, c1: number): Linear {
  assert(c0 >= 0 && c0 < c1 && c1 <= lin.cols, `columns [${c0}, ${c1}) out of a ${lin.cols}-column weight`);
  const cols = c1 - c0;
  const w = new Float32Array(lin.rows * cols);
  for (let r = 0; r < lin.rows; r++) w.set(lin.w.subarray(r * lin.cols + c0, r * lin.cols + c1), r * cols);
  return { rows: lin.rows, cols, w };
}

/** The part [start, end) of n items that shard s of `shards` holds (equal parts when shards divides n). */
export function shardRange(n: number, shards: number, s: number): [number, number] {
  return [Math.floor((s * n) / shards), Math.floor(((s + 1) * n) / shards)];
}

/**
 * hidden[h][d] = hidden[h][d] + (p_0 + ... + p_{S-1})[t][d], the canonical reduction: `all` holds S shard
 * blocks of n * width values (token-major inside a block), token t of the block is hidden[t].
 */
export function addReduced(hidden: Float64Array[], all: Float64Array, shards: number, width: number): void {
  const n = hidden.length;
  const block = n * width;
  assert(all.length >= shards * block, 'addReduced: partials too short');
  for (let t = 0; t < n; t++) {
    const h = hidden[t] as Float64Array;
    for (let d = 0; d < width; d++) {
      const i = t * width + d;
      let r = all[i] as number;
      for (let s = 1; s < shards; s++) r = r + (all[s * block + i] as number);
      h[d] = (h[d] as number) + r;
    }
  }
}

/** The ranks one model instance computes and how it reaches the others. */
export class Parallel {
  /** Ranks of the group (the KV config's tensorParallelSize). */
  readonly size: number;
  readonly shards = TP_SHARDS;
  readonly shardsPerRank: number;
  /** Ranks computed here, in order: one (a rank thread) or all (one process). */
  readonly ranks: readonly number[];
  /** Shards computed here, in order (the shards of `ranks`). */
  readonly localShards: readonly number[];
  private readonly collective: RankCollective | null;
  private readonly gathered = new Scratch();

  constructor(
    size: number,
    /** Layer slabs per rank: rank r's slab of layer slab j is r * numLayerSlabs + j (kv/spec.ts). */
    readonly numLayerSlabs: number,
    ranks?: KernelRanks,
  ) {
    assert(Number.isInteger(size) && size >= 1 && TP_SHARDS % size === 0, `TP ${size} does not divide ${TP_SHARDS}`);
    const r = ranks ?? { size, ranks: Array.from({ length: size }, (_, i) => i), collective: null };
    assert(r.size === size, `kernel ranks of a ${r.size}-rank device for a TP ${size} cache`);
    assert(
      r.ranks.length > 0 && r.ranks.every((x, i) => x === (r.ranks[0] as number) + i && x < size),
      'local ranks must be consecutive',
    );
    assert((r.collective === null) === (r.ranks.length === size), 'a collective exactly when some ranks are elsewhere');
    this.size = size;
    this.shardsPerRank = TP_SHARDS / size;
    this.ranks = [...r.ranks];
    this.localShards = this.ranks.flatMap((rank) => this.shardsOf(rank));
    this.collective = r.collective;
  }

  /** The device slab of layer slab `layerSlab` on `rank`. */
  slabOf(rank: number, layerSlab: number): number {
    return rank * this.numLayerSlabs + layerSlab;
  }

  shardsOf(rank: number): number[] {
    return Array.from({ length: this.shardsPerRank }, (_, i) => rank * this.shardsPerRank + i);
  }

  /** Index of shard s among the shards of its rank. */
  shardInRank(s: number): number {
    return s % this.shardsPerRank;
  }

  /**
   * Every shard's block of `perShard` values, in shard order: `local` holds this instance's shards' blocks
   * (localShards order). Without a collective (every rank here) that is `local` itself.
   */
  gather(local: Float64Array, perShard: number): Float64Array {
    const n = this.localShards.length * perShard;
    assert(local.length >= n, 'gather: local partials too short');
    if (this.collective === null) return local;
    const out = this.gathered.get(this.shards * perShard).subarray(0, this.shards * perShard);
    this.collective.allGather(local.subarray(0, n), out);
    return out;
  }
}
