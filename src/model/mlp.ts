/** The feed-forward block: h += down(silu(gate(n)) * up(n)), n = RMSNorm(h). */
import type { ModelConfig } from './config.ts';
import type { MlpWeights } from './weights.ts';
import { matVec, rmsNorm, silu, Scratch, type FlopCounter } from './ops.ts';

// Module scratch is safe: a forward is synchronous and one module instance serves one thread.
const scratch = new Scratch();

export function applyMlp(w: MlpWeights, hidden: Float64Array, cfg: ModelConfig, fc: FlopCounter): void {
  const m = cfg.mlpHidden;
  const H = cfg.hidden;
  // One scratch buffer by offsets (no subarray views: this runs once per token per layer).
  const buf = scratch.get(H * 2 + 2 * m);
  const xn = 0;
  const gate = H;
  const up = H + m;
  const down = H + 2 * m;
  rmsNorm(hidden, 0, H, w.norm, cfg.rmsEps, buf, xn);
  matVec(w.gate, buf, xn, buf, gate, fc);
  matVec(w.up, buf, xn, buf, up, fc);
  for (let i = 0; i < m; i++) buf[gate + i] = silu(buf[gate + i] as number) * (buf[up + i] as number);
  matVec(w.down, buf, gate, buf, down, fc);
  for (let d = 0; d < H; d++) hidden[d] = (hidden[d] as number) + (buf[down + d] as number);
}
