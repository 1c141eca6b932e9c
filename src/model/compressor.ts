/**
 * The compressor branch of a dsv4-mini layer (DeepSeek-V4's compressor state cache, scaled down):
 * each token's hidden state is compressed to a stateDim f32 vector that is CACHED in the compressor
 * group's page (group 1), then read back through that group's block table, whole pages, and attended
 * over (keys = values = the cached states). The result is added to the residual, so the compressor
 * pages influence the output just as the MLA pages do.
 */
import type { CompressorSpec } from '../kv/spec.ts';
import type { CachePlace, ModelConfig } from './config.ts';
import type { CompressorWeights } from './weights.ts';
import { assert } from '../util/assert.ts';
import { attendSlots, withTailBound, type SlotSet } from './attention.ts';
import { matVec, Scratch, type FlopCounter } from './ops.ts';
import { readStatePages, slotLocation, writeStateSlot } from './pages.ts';

export class CompressorBranch {
  private readonly queries = new Scratch();
  private readonly state = new Scratch();
  private readonly states = new Scratch();
  private readonly probs = new Scratch();
  private readonly att = new Scratch();
  private readonly bound = new Scratch();
  private set: SlotSet | null = null;

  constructor(
    private readonly cfg: ModelConfig,
    private readonly cache: CachePlace<CompressorSpec>,
    private readonly w: CompressorWeights,
  ) {}

  /** Compress token i (normed input xn) into its slot; keep its query for `attend`. */
  writeToken(
    table: readonly number[],
    slabs: Uint8Array[],
    i: number,
    numTokens: number,
    pos: number,
    xn: Float64Array,
    fc: FlopCounter,
  ): void {
    const { spec } = this.cache;
    const sd = spec.stateDim;
    const state = this.state.get(sd);
    matVec(this.w.wc, xn, 0, state, 0, fc);
    matVec(this.w.wq, xn, 0, this.queries.get(numTokens * sd), i * sd, fc);
    const { block, slot } = slotLocation(table, spec.blockSize, pos, this.cfg.numBlocks);
    writeStateSlot(slabs[this.cache.slab] as Uint8Array, spec, this.cfg.pageBytes, block, slot, state, 0);
  }

  /** Decode every slot of every compressor page in the table. */
  readPages(table: readonly number[], slabs: Uint8Array[]): void {
    const { spec } = this.cache;
    const sd = spec.stateDim;
    const out = this.states.get(table.length * spec.blockSize * sd);
    const numSlots = readStatePages(slabs[this.cache.slab] as Uint8Array, spec, this.cfg.pageBytes, table, out);
    const set = { numSlots, keys: out, kStride: sd, kOff: 0, values: out, vStride: sd, vOff: 0 };
    this.set = withTailBound(set, sd, sd, this.bound.get(numSlots + 1));
  }

  /** out[0..hidden) = wo . attention of token i's query over the cached states (after readPages). */
  attend(i: number, pos: number, out: Float64Array, fc: FlopCounter): void {
    const sd = this.cache.spec.stateDim;
    const set = this.set;
    assert(set !== null, 'compressor: attend before readPages');
    const att = this.att.get(sd);
    attendSlots(
      this.queries.get(0),
      i * sd,
      sd,
      set,
      sd,
      pos,
      1 / Math.sqrt(sd),
      this.probs.get(set.numSlots),
      att,
      0,
      fc,
    );
    matVec(this.w.wo, att, 0, out, 0, fc);
  }
}
