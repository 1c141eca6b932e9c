/**
 * Which bytes of a whole (TP=1) page each tensor parallel rank's page holds: what the map between
 * different TP degrees goes through (tp_map.ts; vLLM PRs 18833 and 20189 read a head slice per decode
 * rank; TRT-LLM issue 6507 is what a wrong map gives).
 *
 * A rank's page has the TP=1 format of its own spec (spec.ts rankSpec): its KV heads, compressor heads or
 * Mamba channels, in global order, the MLA latent replicated. Pages are token-major (NHD), so a rank's
 * heads are one run of bytes per token slot, not one run per page:
 *
 *   whole GQA K block   | t0: h0 h1 | t1: h0 h1 | ...        (then the V block, the same way)
 *   rank 0 (TP=2)       | t0: h0    | t1: h0    | ...
 *   rank 1 (TP=2)       | t0: h1    | t1: h1    | ...
 *
 *   compressor          per slot: the rank's heads' state values (stateDim / TP f32)
 *   Mamba               per conv row: the rank's channels (convDim / TP f32); then its channels' SSM rows
 *   MLA                 the whole page (replicated)
 */
import { assert } from '../util/assert.ts';
import { rankSpec, realPageBytes, type KVCacheSpec } from './spec.ts';

/** `length` bytes at `wholeOffset` of the whole page are at `rankOffset` of the rank's page. */
export interface PageRun {
  wholeOffset: number;
  rankOffset: number;
  length: number;
}

/** Rank `rank` of `tp`: where each byte of its page comes from in the whole page of `spec` (a whole spec). */
export function rankPageRuns(spec: KVCacheSpec, tp: number, rank: number): PageRun[] {
  assert(Number.isInteger(rank) && rank >= 0 && rank < tp, `rank ${rank} out of [0, ${tp})`);
  const mine = rankSpec(spec, tp);
  const runs: PageRun[] = [];
  // `count` runs of `length` bytes: the k-th at wholeBase + k * wholeStride and rankBase + k * rankStride.
  const strided = (count: number, wholeBase: number, wholeStride: number, rankBase: number, rankStride: number) => {
    const length = rankStride;
    for (let k = 0; k < count; k++)
      runs.push({ wholeOffset: wholeBase + k * wholeStride, rankOffset: rankBase + k * rankStride, length });
  };
  switch (spec.type) {
    case 'mla':
      return [{ wholeOffset: 0, rankOffset: 0, length: realPageBytes(spec) }];
    case 'full_attention': {
      assert(mine.type === 'full_attention', 'rank spec keeps its type');
      const whole = spec.numKvHeads * spec.headSize * 2;
      const part = mine.numKvHeads * spec.headSize * 2;
      strided(spec.blockSize, rank * part, whole, 0, part);
      strided(spec.blockSize, spec.blockSize * whole + rank * part, whole, spec.blockSize * part, part);
      return runs;
    }
    case 'compressor': {
      const part = (spec.stateDim / tp) * 4;
      strided(spec.blockSize, rank * part, spec.stateDim * 4, 0, part);
      return runs;
    }
    case 'mamba': {
      const d = spec.convDim;
      const part = (d / tp) * 4;
      strided(spec.convWidth, rank * part, d * 4, 0, part);
      const ssmRank = (d / tp) * spec.ssmStateDim * 4;
      runs.push({
        wholeOffset: spec.convWidth * d * 4 + rank * ssmRank,
        rankOffset: spec.convWidth * part,
        length: ssmRank,
      });
      return runs;
    }
  }
}
