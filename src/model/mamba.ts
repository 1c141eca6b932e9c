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
 */
import { assert } from '../util/assert.ts';
import type { MambaSpec } from '../kv/spec.ts';
import type { CachePlace, ModelConfig } from './config.ts';
import type { MambaWeights } from './weights.ts';
import { blockTable, type Chunk } from './attention.ts';
import { applyMlp } from './mlp.ts';
import { matVec, rmsNorm, silu, softplus, type FlopCounter } from './ops.ts';
import { readMambaState, writeMambaState } from './pages.ts';

export class MambaLayer {
  private readonly conv: Float32Array;
  private readonly ssm: Float32Array;
  private readonly buf: Float64Array;

  constructor(
    private readonly cfg: ModelConfig,
    private readonly cache: CachePlace<MambaSpec>,
    private readonly w: MambaWeights,
  ) {
    const { convDim, convWidth, ssmStateDim } = cache.spec;
    assert(convWidth >= 1 && convDim === cfg.hidden, 'Mamba layer needs convWidth >= 1 and convDim == hidden');
    this.conv = new Float32Array(convWidth * convDim);
    this.ssm = new Float32Array(convDim * ssmStateDim);
    this.buf = new Float64Array(cfg.hidden + 5 * convDim + 2 * ssmStateDim);
  }

  forward(chunk: Chunk, slabs: Uint8Array[], fc: FlopCounter): void {
    const { cfg, cache, w, conv, ssm } = this;
    const { convDim: d, convWidth: cw, ssmStateDim: ns } = cache.spec;
    const table = blockTable(chunk, cache.group);
    // Invariant: one running state page per request (the KV manager never gives a Mamba group more).
    assert(table.length === 1, () => `a Mamba group holds exactly one state page, got ${table.length}`);
    const block = table[0] as number;
    assert(block >= 1 && block < cfg.numBlocks, `bad Mamba state block ${block}`);
    const slab = slabs[cache.slab] as Uint8Array;
    if (chunk.startPos === 0) {
      conv.fill(0);
      ssm.fill(0);
    } else {
      readMambaState(slab, cache.spec, cfg.pageBytes, block, conv, ssm);
    }
    const b = this.buf;
    let o = 0;
    const xn = b.subarray(o, (o += cfg.hidden));
    const u = b.subarray(o, (o += d));
    const z = b.subarray(o, (o += d));
    const a = b.subarray(o, (o += d));
    const dt = b.subarray(o, (o += d));
    const y = b.subarray(o, (o += d));
    const B = b.subarray(o, (o += ns));
    const C = b.subarray(o, (o += ns));
    const out = xn; // reused after the projections
    for (const hid of chunk.hidden) {
      rmsNorm(hid, 0, cfg.hidden, w.norm, cfg.rmsEps, xn, 0);
      matVec(w.wIn, xn, 0, u, 0, fc);
      matVec(w.wZ, xn, 0, z, 0, fc);
      for (let i = 0; i < d; i++) u[i] = Math.fround(u[i] as number);
      for (let i = 0; i < d; i++) {
        let c = w.convBias[i] as number;
        for (let k = 0; k < cw; k++) c += (w.conv[k * d + i] as number) * (conv[k * d + i] as number);
        c += (w.conv[cw * d + i] as number) * (u[i] as number);
        a[i] = silu(c);
        dt[i] = softplus((w.dtWeight[i] as number) * (a[i] as number) + (w.dtBias[i] as number));
      }
      // Shift the conv window: drop the oldest input, append this one.
      conv.copyWithin(0, d);
      conv.set(u, (cw - 1) * d);
      matVec(w.wB, a, 0, B, 0, fc);
      matVec(w.wC, a, 0, C, 0, fc);
      for (let i = 0; i < d; i++) {
        const dti = dt[i] as number;
        const ai = a[i] as number;
        let acc = 0;
        for (let k = 0; k < ns; k++) {
          const j = i * ns + k;
          ssm[j] = Math.exp(dti * (w.aNeg[j] as number)) * (ssm[j] as number) + dti * (B[k] as number) * ai;
          acc += (C[k] as number) * (ssm[j] as number);
        }
        y[i] = (acc + (w.dSkip[i] as number) * ai) * silu(z[i] as number);
      }
      fc.flops += d * (2 * cw + 12 + 6 * ns);
      matVec(w.wOut, y, 0, out, 0, fc);
      for (let i = 0; i < cfg.hidden; i++) hid[i] = (hid[i] as number) + (out[i] as number);
      applyMlp(w.mlp, hid, cfg, fc);
    }
    writeMambaState(slab, cache.spec, cfg.pageBytes, block, conv, ssm);
  }
}
