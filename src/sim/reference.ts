/**
 * The accuracy oracle's ground truth: each request run alone, colocated, straight on the model (no
 * engine, no connector, no scheduling: the smallest program that computes it, so nothing the P/D
 * engines under test share can hide a bug on both sides). Batch and chunk invariance make this what
 * P/D must match, token for token and logit hash for logit hash; the engine-level colocated comparison
 * is `handoff ab` and the P/D pair tests. Results are memoised per (preset, model seed, prompt,
 * sampling), so seeds that share requests pay once; the model and pages are kept per pool size (rigFor).
 */
import { assert } from '../util/assert.ts';
import { presetKVGroups, type ModelPreset } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import { eosTokenIdOf } from '../model/config.ts';
import { createModel, type Model } from '../model/model.ts';
import type { SimRequestSpec } from './proxy.ts';

export interface ReferenceResult {
  tokenIds: number[];
  logitsHashes: Array<string | null>;
}

const memo = new Map<string, ReferenceResult>();
const MEMO_MAX = 4096;

/**
 * The model and its pages for runAlone, kept per (preset, model seed, pool size): building a model (its
 * layers' weight slices, scratch buffers that grow on first use) cost as much as a short request. The
 * pool is a power of two of pages, at least what the request needs; the pages a run uses are zeroed
 * before it, so every run still starts from fresh, zeroed pages.
 */
const rigs = new Map<string, { model: Model; slabs: Uint8Array[]; pageBytes: number }>();
const RIGS_MAX = 16;

function rigFor(preset: ModelPreset, modelSeed: number, pagesUsed: number) {
  const numBlocks = Math.max(8, 2 ** Math.ceil(Math.log2(pagesUsed)));
  const key = `${preset}:${modelSeed}:${numBlocks}`;
  let rig = rigs.get(key);
  if (rig === undefined) {
    const kvConfig = makeKVCacheConfig(presetKVGroups(preset), numBlocks);
    const slabs = Array.from({ length: kvConfig.numSlabs }, () => new Uint8Array(numBlocks * kvConfig.pageBytes));
    rig = { model: createModel(preset, modelSeed, kvConfig), slabs, pageBytes: kvConfig.pageBytes };
    if (rigs.size >= RIGS_MAX) rigs.clear();
    rigs.set(key, rig);
  }
  for (const s of rig.slabs) s.fill(0, 0, pagesUsed * rig.pageBytes);
  return rig;
}

function keyOf(preset: ModelPreset, modelSeed: number, r: SimRequestSpec): string {
  return JSON.stringify([preset, modelSeed, r.promptTokenIds, r.sampling]);
}

/**
 * One request alone on the model, the way a colocated engine computes it: the whole prompt in one
 * forward (chunk invariance: a chunked prefill gives the same bytes), then one token per forward, each
 * sampled with (seed, output index), stopping at max_tokens, EOS (unless ignored) or a stop token. Its
 * own fresh, zeroed pages; block ids distinct across groups, as the hybrid allocator hands them out.
 */
function runAlone(preset: ModelPreset, modelSeed: number, r: SimRequestSpec): ReferenceResult {
  const maxTokens = r.sampling.maxTokens;
  const longest = r.promptTokenIds.length + maxTokens;
  const groups = presetKVGroups(preset);
  const tables: number[][] = [];
  let next = 1;
  for (const g of groups) {
    const pages = g.spec.type === 'mamba' ? 1 : Math.ceil(longest / g.spec.blockSize);
    tables.push(Array.from({ length: pages }, () => next++));
  }
  const { model, slabs } = rigFor(preset, modelSeed, next);
  const s = r.sampling;
  const stops = new Set(s.stopTokenIds ?? []);
  const out: ReferenceResult = { tokenIds: [], logitsHashes: [] };
  let input = r.promptTokenIds;
  let pos = 0;
  for (let k = 0; k < maxTokens; k++) {
    const sampling = { temperature: s.temperature ?? 0, topP: s.topP, topK: s.topK, seed: s.seed ?? 0, outputIndex: k };
    const req = { requestId: 'ref', tokenIds: input, startPos: pos, blockTables: tables, sample: true, sampling };
    const o = model.forward({ step: k, requests: [req] }, slabs).outputs[0];
    assert(o !== undefined && o.error === undefined && o.tokenId !== null, 'the reference forward samples a token');
    out.tokenIds.push(o.tokenId);
    out.logitsHashes.push(o.logitsHash);
    if ((!s.ignoreEos && o.tokenId === eosTokenIdOf(preset)) || stops.has(o.tokenId)) break;
    pos += input.length;
    input = [o.tokenId];
  }
  return out;
}

export function colocatedReference(
  preset: ModelPreset,
  modelSeed: number,
  reqs: readonly SimRequestSpec[],
): ReferenceResult[] {
  return reqs.map((r) => {
    const key = keyOf(preset, modelSeed, r);
    const hit = memo.get(key);
    if (hit !== undefined) return hit;
    const res = runAlone(preset, modelSeed, r);
    if (memo.size >= MEMO_MAX) memo.clear();
    memo.set(key, res);
    return res;
  });
}
