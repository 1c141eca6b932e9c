/**
 * The feed-forward block: h += down(silu(gate(n)) * up(n)), n = RMSNorm(h), for every token of a chunk.
 *
 * Tensor parallel (parallel.ts): gate and up are column-parallel (shard s computes hidden units
 * [s*M/S, (s+1)*M/S)), down is row-parallel (shard s contracts over those units only), so each shard
 * yields a partial sum of `down` and the chunk's residuals get the shard-ordered reduction, once per chunk.
 */
import type { ModelConfig } from './config.ts';
import type { MlpWeights } from './weights.ts';
import { matVec, rmsNorm, silu, Scratch, type FlopCounter, type Linear } from './ops.ts';
import { addReduced, colsOf, rowsOf, shardRange, type Parallel } from './parallel.ts';

interface MlpShard {
  gate: Linear;
  up: Linear;
  down: Linear;
}

export class ParallelMlp {
  private readonly shards: MlpShard[];
  private readonly xn = new Scratch();
  private readonly act = new Scratch();
  private readonly partials = new Scratch();

  constructor(
    private readonly w: MlpWeights,
    private readonly cfg: ModelConfig,
    private readonly par: Parallel,
  ) {
    this.shards = par.localShards.map((s) => {
      const [m0, m1] = shardRange(cfg.mlpHidden, par.shards, s);
      return { gate: rowsOf(w.gate, m0, m1), up: rowsOf(w.up, m0, m1), down: colsOf(w.down, m0, m1) };
    });
  }

  /** hidden[t] += MLP(hidden[t]) for every token t (their residuals are independent of each other). */
  apply(hidden: Float64Array[], fc: FlopCounter): void {
    const { cfg, w, par } = this;
    const width = cfg.hidden;
    const n = hidden.length;
    const xn = this.xn.get(n * width);
    hidden.forEach((h, t) => rmsNorm(h, 0, width, w.norm, cfg.rmsEps, xn, t * width));
    const partials = this.partials.get(this.shards.length * n * width);
    this.shards.forEach((sh, k) => {
      const m = sh.gate.rows;
      const buf = this.act.get(2 * m);
      const gate = buf.subarray(0, m);
      const up = buf.subarray(m, 2 * m);
      for (let t = 0; t < n; t++) {
        matVec(sh.gate, xn, t * width, gate, 0, fc);
        matVec(sh.up, xn, t * width, up, 0, fc);
        for (let i = 0; i < m; i++) gate[i] = silu(gate[i] as number) * (up[i] as number);
        matVec(sh.down, gate, 0, partials, (k * n + t) * width, fc);
      }
    });
    addReduced(hidden, par.gather(partials, n * width), par.shards, width);
  }
}
