/** The feed-forward block: h += down(silu(gate(n)) * up(n)), n = RMSNorm(h). */
import type { ModelConfig } from './config.ts';
import type { MlpWeights } from './weights.ts';
import { matVec, rmsNorm, silu, Scratch, type FlopCounter } from './ops.ts';

// Module scratch is safe: a forward is synchronous and one module instance serves one thread.
const scratch = new Scratch();

export function applyMlp(w: MlpWeights, hidden: Float64Array, cfg: ModelConfig, fc: FlopCounter): void {
  const m = cfg.mlpHidden;
  const buf = scratch.get(cfg.hidden * 2 + 2 * m);
  const xn = buf.subarray(0, cfg.hidden);
  const gate = buf.subarray(cfg.hidden, cfg.hidden + m);
  const up = buf.subarray(cfg.hidden + m, cfg.hidden + 2 * m);
  const down = buf.subarray(cfg.hidden + 2 * m, 2 * cfg.hidden + 2 * m);
  rmsNorm(hidden, 0, cfg.hidden, w.norm, cfg.rmsEps, xn, 0);
  matVec(w.gate, xn, 0, gate, 0, fc);
  matVec(w.up, xn, 0, up, 0, fc);
  for (let i = 0; i < m; i++) gate[i] = silu(gate[i] as number) * (up[i] as number);
  matVec(w.down, gate, 0, down, 0, fc);
  for (let d = 0; d < cfg.hidden; d++) hidden[d] = (hidden[d] as number) + (down[d] as number);
}
