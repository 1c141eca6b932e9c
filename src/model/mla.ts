/**
 * The dsv4-mini layer: MLA-style attention over an fp8 latent cache, a compressor branch over an f32
 * state cache, and an MLP.
 *
 * One latent "KV head" per token: latent = [ NoPE part (latentDim, RMS-normed) | RoPE part (ropeDim,
 * rotated by position) ]. It is written into the MLA group's page as fp8 e4m3 with per-tile f32
 * scales plus the bf16 rope part (spec.ts layout), then read back, whole pages, dequantized. The
 * query heads attend to it: keys = the whole latent, values = its NoPE part (absorbed-MLA style),
 * output projection from numHeads x latentDim to hidden.
 */
import type { CompressorSpec, MLAAttentionSpec } from '../kv/spec.ts';
import type { CachePlace, ModelConfig } from './config.ts';
import type { MlaWeights } from './weights.ts';
import { attendSlots, blockTable, withTailBound, type Chunk } from './attention.ts';
import { CompressorBranch } from './compressor.ts';
import { applyMlp } from './mlp.ts';
import { matVec, rmsNorm, rope, Scratch, type FlopCounter } from './ops.ts';
import { readLatentPages, slotLocation, writeLatentSlot } from './pages.ts';

export class MlaLayer {
  private readonly q = new Scratch();
  private readonly lat = new Scratch();
  private readonly keys = new Scratch();
  private readonly probs = new Scratch();
  private readonly tmp = new Scratch();
  private readonly bound = new Scratch();
  private readonly compressor: CompressorBranch;
  private readonly compressorGroup: number;

  constructor(
    private readonly cfg: ModelConfig,
    private readonly cache: CachePlace<MLAAttentionSpec>,
    compressorCache: CachePlace<CompressorSpec>,
    private readonly numHeads: number,
    private readonly w: MlaWeights,
  ) {
    this.compressor = new CompressorBranch(cfg, compressorCache, w.compressor);
    this.compressorGroup = compressorCache.group;
  }

  forward(chunk: Chunk, slabs: Uint8Array[], fc: FlopCounter): void {
    const { cfg, cache, numHeads, w } = this;
    const spec = cache.spec;
    const slab = slabs[cache.slab] as Uint8Array;
    const table = blockTable(chunk, cache.group);
    const compTable = blockTable(chunk, this.compressorGroup);
    const L = spec.latentDim;
    const dim = L + spec.ropeDim;
    const qDim = numHeads * dim;
    const n = chunk.hidden.length;
    const q = this.q.get(n * qDim);
    const lat = this.lat.get(dim + cfg.hidden);
    const xn = lat.subarray(dim, dim + cfg.hidden);
    // 1. This chunk's latents and compressor states: project, normalise, rotate, write.
    for (let i = 0; i < n; i++) {
      const pos = chunk.startPos + i;
      rmsNorm(chunk.hidden[i] as Float64Array, 0, cfg.hidden, w.norm, cfg.rmsEps, xn, 0);
      matVec(w.wq, xn, 0, q, i * qDim, fc);
      for (let h = 0; h < numHeads; h++) rope(q, i * qDim + h * dim + L, spec.ropeDim, pos, cfg.ropeTheta);
      matVec(w.wkv, xn, 0, lat, 0, fc);
      rmsNorm(lat, 0, L, w.kvNorm, cfg.rmsEps, lat, 0);
      rope(lat, L, spec.ropeDim, pos, cfg.ropeTheta);
      const { block, slot } = slotLocation(table, spec.blockSize, pos, cfg.numBlocks);
      writeLatentSlot(slab, spec, cfg.pageBytes, block, slot, lat, 0);
      this.compressor.writeToken(compTable, slabs, i, n, pos, xn, fc);
    }
    // 2. Read whole pages of both groups back (own tokens included, as stored) and attend.
    const slots = table.length * spec.blockSize;
    const keys = this.keys.get(slots * dim);
    readLatentPages(slab, spec, cfg.pageBytes, table, keys);
    this.compressor.readPages(compTable, slabs);
    const probs = this.probs.get(slots);
    const tmp = this.tmp.get(numHeads * L + 2 * cfg.hidden);
    const att = tmp.subarray(0, numHeads * L);
    const proj = tmp.subarray(numHeads * L, numHeads * L + cfg.hidden);
    const comp = tmp.subarray(numHeads * L + cfg.hidden, numHeads * L + 2 * cfg.hidden);
    const set = withTailBound(
      { numSlots: slots, keys, kStride: dim, kOff: 0, values: keys, vStride: dim, vOff: 0 },
      dim,
      L,
      this.bound.get(slots + 1),
    );
    const scale = 1 / Math.sqrt(dim);
    for (let i = 0; i < n; i++) {
      const pos = chunk.startPos + i;
      for (let h = 0; h < numHeads; h++)
        attendSlots(q, i * qDim + h * dim, dim, set, L, pos, scale, probs, att, h * L, fc);
      matVec(w.wo, att, 0, proj, 0, fc);
      this.compressor.attend(i, pos, comp, fc);
      const hid = chunk.hidden[i] as Float64Array;
      for (let d = 0; d < cfg.hidden; d++) hid[d] = (hid[d] as number) + (proj[d] as number) + (comp[d] as number);
      applyMlp(w.mlp, hid, cfg, fc);
    }
  }
}
