/**
 * A Mamba-style recurrent layer (selective SSM with a short causal convolution) + MLP.
 *
 * Per request it keeps ONE running state page (group 1): conv state = the convWidth previous inputs
 * (oldest first) x convDim, then the SSM state convDim x ssmStateDim, both f32. At startPos == 0 the
 * state starts from zero whatever the page holds (Mamba pages are never zeroed, so nothing may rely
 * on it); otherwise it is read from the page. It is written back after the chunk.
 *
 * Invariant: the state is stored as f32 after every token (Float32Array), so stopping after any
 * token and reloading from the page gives bit-identical results (chunk invariance).
 *
 *   u = W_in n, z = W_z n                      n = RMSNorm(h)
 *   c = conv(previous inputs, u) + bias,  a = silu(c)
 *   dt = softplus(dtWeight * a + dtBias),  B = W_B a,  C = W_C a
 *   s[d][k] = exp(dt[d] A[d][k]) s[d][k] + dt[d] B[k] a[d]
 *   y[d] = (sum_k C[k] s[d][k] + D[d] a[d]) * silu(z[d]),  h += W_out y
 *
 * Tensor parallel: channels are SPLIT (like vLLM's Mamba mixers, sharded over heads): rank r holds the
 * conv and SSM state of channels [r*d/TP, (r+1)*d/TP) in its own page, and every per-channel step is
 * local. W_in and W_z are column-parallel; B and C contract over channels, so they are row-parallel
 * (a partial per shard, reduced in shard order before the scan), and so is W_out. Replicating the layer
 * would need no reduction, but every rank would hold (and a P/D transfer would move) every channel's
 * state; split, a rank's state page holds only its share, like its attention pages.
 */
import { assert } from '../util/assert.ts';
import type { MambaSpec } from '../kv/spec.ts';
import type { CachePlace, ModelConfig } from './config.ts';
import type { MambaWeights } from './weights.ts';
import { blockTable, type Chunk } from './attention.ts';
import { ParallelMlp } from './mlp.ts';
import { matVec, rmsNorm, Scratch, silu, softplus, type FlopCounter, type Linear } from './ops.ts';
import { addReduced, colsOf, rowsOf, type Parallel } from './parallel.ts';
import { readMambaState, writeMambaState } from './pages.ts';

interface MambaShard {
  /** First global channel of the shard. */
  c0: number;
  wB: Linear;
  wC: Linear;
  wOut: Linear;
}

interface MambaRank {
  rank: number;
  /** First global channel of the rank. */
  c0: number;
  wIn: Linear;
  wZ: Linear;
  shards: MambaShard[];
  conv: Float32Array;
  ssm: Float32Array;
}

export class MambaLayer {
  private readonly ranks: MambaRank[];
  private readonly mlp: ParallelMlp;
  /** Channels per rank, per shard. */
  private readonly dRank: number;
  private readonly dShard: number;
  private readonly xn = new Scratch();
  private readonly u = new Scratch();
  /** Per token, per local channel: silu(conv), dt, z. */
  private readonly acts = new Scratch();
  private readonly bc = new Scratch();
  private readonly y = new Scratch();
  private readonly partials = new Scratch();

  constructor(
    private readonly cfg: ModelConfig,
    /** One rank's state cache (its channels). */
    private readonly cache: CachePlace<MambaSpec>,
    private readonly w: MambaWeights,
    private readonly par: Parallel,
  ) {
    const { convDim, convWidth, ssmStateDim } = cache.spec;
    assert(convWidth >= 1 && convDim * par.size === cfg.hidden, 'Mamba layer needs convWidth >= 1, channels = hidden');
    this.dRank = convDim;
    this.dShard = convDim / par.shardsPerRank;
    const ds = this.dShard;
    this.ranks = par.ranks.map((rank) => ({
      rank,
      c0: rank * convDim,
      wIn: rowsOf(w.wIn, rank * convDim, (rank + 1) * convDim),
      wZ: rowsOf(w.wZ, rank * convDim, (rank + 1) * convDim),
      shards: par.shardsOf(rank).map((s) => ({
        c0: s * ds,
        wB: colsOf(w.wB, s * ds, (s + 1) * ds),
        wC: colsOf(w.wC, s * ds, (s + 1) * ds),
        wOut: colsOf(w.wOut, s * ds, (s + 1) * ds),
      })),
      conv: new Float32Array(convWidth * convDim),
      ssm: new Float32Array(convDim * ssmStateDim),
    }));
    this.mlp = new ParallelMlp(w.mlp, cfg, par);
  }

  forward(chunk: Chunk, slabs: Uint8Array[], fc: FlopCounter): void {
    const { cfg, cache, par } = this;
    const table = blockTable(chunk, cache.group);
    // Invariant: one running state page per request (the KV manager never gives a Mamba group more).
    assert(table.length === 1, () => `a Mamba group holds exactly one state page, got ${table.length}`);
    const block = table[0] as number;
    assert(block >= 1 && block < cfg.numBlocks, `bad Mamba state block ${block}`);
    const n = chunk.hidden.length;
    const width = cfg.hidden;
    const ns = cache.spec.ssmStateDim;
    const xn = this.xn.get(n * width);
    chunk.hidden.forEach((h, t) => rmsNorm(h, 0, width, this.w.norm, cfg.rmsEps, xn, t * width));
    // 1. Per rank: state in, convolution over the chunk, B and C partials per shard.
    const bcPartials = this.partials.get(par.localShards.length * n * 2 * ns);
    this.ranks.forEach((r, ri) => {
      const slab = slabs[par.slabOf(r.rank, cache.slab)] as Uint8Array;
      if (chunk.startPos === 0) (r.conv.fill(0), r.ssm.fill(0));
      else readMambaState(slab, cache.spec, cfg.pageBytes, block, r.conv, r.ssm);
      this.convolve(r, ri, xn, n, fc);
      r.shards.forEach((sh, k) => this.bcPartials(sh, ri, ri * r.shards.length + k, n, bcPartials, fc));
    });
    const bc = this.bc.get(n * 2 * ns);
    reduceInto(par.gather(bcPartials, n * 2 * ns), par.shards, n * 2 * ns, bc);
    // 2. Per rank: the scan over the chunk, W_out partials per shard; state out.
    const outPartials = this.partials.get(par.localShards.length * n * width);
    this.ranks.forEach((r, ri) => {
      this.scan(r, ri, bc, n, outPartials, fc);
      writeMambaState(
        slabs[par.slabOf(r.rank, cache.slab)] as Uint8Array,
        cache.spec,
        cfg.pageBytes,
        block,
        r.conv,
        r.ssm,
      );
    });
    addReduced(chunk.hidden, par.gather(outPartials, n * width), par.shards, width);
    this.mlp.apply(chunk.hidden, fc);
  }

  /** u, z, the causal convolution and dt of every token for rank r's channels (acts: [t][a | dt | z] per channel). */
  private convolve(r: MambaRank, ri: number, xn: Float64Array, n: number, fc: FlopCounter): void {
    const { w } = this;
    const d = this.cfg.hidden;
    const dr = this.dRank;
    const cw = this.cache.spec.convWidth;
    const u = this.u.get(2 * dr);
    const z = u.subarray(dr, 2 * dr);
    const acts = this.acts.get(this.ranks.length * n * 3 * dr);
    for (let t = 0; t < n; t++) {
      matVec(r.wIn, xn, t * d, u, 0, fc);
      matVec(r.wZ, xn, t * d, z, 0, fc);
      const base = (ri * n + t) * 3 * dr;
      for (let c = 0; c < dr; c++) {
        u[c] = Math.fround(u[c] as number);
        const i = r.c0 + c;
        let sum = w.convBias[i] as number;
        for (let k = 0; k < cw; k++) sum += (w.conv[k * d + i] as number) * (r.conv[k * dr + c] as number);
        sum += (w.conv[cw * d + i] as number) * (u[c] as number);
        const a = silu(sum);
        acts[base + c] = a;
        acts[base + dr + c] = softplus((w.dtWeight[i] as number) * a + (w.dtBias[i] as number));
        acts[base + 2 * dr + c] = z[c] as number;
      }
      // Shift the conv window: drop the oldest input, append this one.
      r.conv.copyWithin(0, dr);
      r.conv.set(u.subarray(0, dr), (cw - 1) * dr);
    }
  }

  /** Partials of B = W_B a and C = W_C a over shard sh's channels, per token: [t][B | C]. */
  private bcPartials(sh: MambaShard, ri: number, k: number, n: number, out: Float64Array, fc: FlopCounter): void {
    const ns = this.cache.spec.ssmStateDim;
    const dr = this.dRank;
    const acts = this.acts.get(0);
    const local = sh.c0 - (this.ranks[ri] as MambaRank).c0;
    for (let t = 0; t < n; t++) {
      const a = (ri * n + t) * 3 * dr + local;
      matVec(sh.wB, acts, a, out, (k * n + t) * 2 * ns, fc);
      matVec(sh.wC, acts, a, out, (k * n + t) * 2 * ns + ns, fc);
    }
  }

  /** The selective scan of rank r's channels over the chunk, then W_out partials per shard. */
  private scan(r: MambaRank, ri: number, bc: Float64Array, n: number, out: Float64Array, fc: FlopCounter): void {
    const { w } = this;
    const ns = this.cache.spec.ssmStateDim;
    const dr = this.dRank;
    const width = this.cfg.hidden;
    const acts = this.acts.get(0);
    const y = this.y.get(dr);
    for (let t = 0; t < n; t++) {
      const base = (ri * n + t) * 3 * dr;
      const b = t * 2 * ns;
      for (let c = 0; c < dr; c++) {
        const i = r.c0 + c;
        const dti = acts[base + dr + c] as number;
        const ai = acts[base + c] as number;
        let acc = 0;
        for (let k = 0; k < ns; k++) {
          const j = c * ns + k;
          const g = i * ns + k;
          r.ssm[j] = Math.exp(dti * (w.aNeg[g] as number)) * (r.ssm[j] as number) + dti * (bc[b + k] as number) * ai;
          acc += (bc[b + ns + k] as number) * (r.ssm[j] as number);
        }
        y[c] = (acc + (w.dSkip[i] as number) * ai) * silu(acts[base + 2 * dr + c] as number);
      }
      fc.flops += dr * (2 * this.cache.spec.convWidth + 12 + 6 * ns);
      r.shards.forEach((sh, k) =>
        matVec(sh.wOut, y, sh.c0 - r.c0, out, ((ri * r.shards.length + k) * n + t) * width, fc),
      );
    }
  }
}

/** out[i] = (p_0 + p_1 + ... + p_{S-1})[i], in shard order (parallel.ts), for `block` values per shard. */
function reduceInto(all: Float64Array, shards: number, block: number, out: Float64Array): void {
  for (let i = 0; i < block; i++) {
    let r = all[i] as number;
    for (let s = 1; s < shards; s++) r = r + (all[s * block + i] as number);
    out[i] = r;
  }
}
