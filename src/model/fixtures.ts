/**
 * Test fixtures for the model: slabs, a trivial page allocator, request builders and a generate
 * loop. Plain helpers used by the model's tests and by other layers' tests that need a real model.
 */
import { assert } from '../util/assert.ts';
import { presetKVGroups, type ModelPreset } from '../kv/presets.ts';
import { makeKVCacheConfig, type KVCacheConfig } from '../kv/spec.ts';
import type { Model } from './model.ts';
import type { ForwardOutput, ForwardRequest, SamplingParams } from './types.ts';

export const GREEDY: SamplingParams = { temperature: 0, seed: 0, outputIndex: 0 };

export function kvConfigFor(preset: ModelPreset, numBlocks = 64, tp = 1): KVCacheConfig {
  return makeKVCacheConfig(presetKVGroups(preset), numBlocks, tp);
}

/** One zeroed slab per layer index on every rank; over SharedArrayBuffers when `shared`. */
export function makeSlabs(kv: KVCacheConfig, shared = false): Uint8Array[] {
  const bytes = kv.numBlocks * kv.pageBytes;
  return Array.from(
    { length: kv.numSlabs },
    () => new Uint8Array(shared ? new SharedArrayBuffer(bytes) : new ArrayBuffer(bytes)),
  );
}

/** Hands out block ids 1, 2, 3, ... (never the null block), like a fresh BlockPool. */
export class PageCounter {
  private next: number;
  constructor(
    private readonly kv: KVCacheConfig,
    first = 1,
  ) {
    this.next = first;
  }
  take(): number {
    assert(this.next < this.kv.numBlocks, 'fixture ran out of pages');
    return this.next++;
  }
  /** Grow `tables` (per group) to cover numTokens: attention groups by pages, Mamba groups to one page. */
  cover(tables: number[][], numTokens: number): number[][] {
    this.kv.groups.forEach((g, i) => {
      const t = (tables[i] ??= []);
      const want = g.spec.type === 'mamba' ? 1 : Math.ceil(numTokens / g.spec.blockSize);
      while (t.length < want) t.push(this.take());
    });
    return tables;
  }
}

export function promptTokens(n: number, salt = 0, vocabSize = 50257): number[] {
  return Array.from({ length: n }, (_, i) => (i * 7919 + salt * 104729 + 17) % vocabSize);
}

export function request(
  requestId: string,
  tokenIds: number[],
  startPos: number,
  blockTables: number[][],
  opts: { sample?: boolean; sampling?: SamplingParams } = {},
): ForwardRequest {
  return {
    requestId,
    tokenIds,
    startPos,
    blockTables: blockTables.map((t) => [...t]),
    sample: opts.sample ?? true,
    sampling: opts.sampling ?? GREEDY,
  };
}

/** Prefill `prompt` in chunks of the given sizes (covering it), then decode `steps` tokens. */
export function generate(
  model: Model,
  slabs: Uint8Array[],
  pages: PageCounter,
  prompt: number[],
  steps: number,
  opts: { chunks?: number[]; sampling?: SamplingParams; requestId?: string } = {},
): ForwardOutput[] {
  const chunks = opts.chunks ?? [prompt.length];
  assert(chunks.reduce((a, b) => a + b, 0) === prompt.length, 'chunks must cover the prompt');
  const sampling = opts.sampling ?? GREEDY;
  const id = opts.requestId ?? 'r';
  const tables: number[][] = [];
  const outs: ForwardOutput[] = [];
  let pos = 0;
  for (const [i, n] of chunks.entries()) {
    pages.cover(tables, pos + n);
    const last = i === chunks.length - 1;
    const r = request(id, prompt.slice(pos, pos + n), pos, tables, {
      sample: last,
      sampling: { ...sampling, outputIndex: 0 },
    });
    const out = model.forward({ step: i, requests: [r] }, slabs).outputs[0] as ForwardOutput;
    if (last) outs.push(out);
    pos += n;
  }
  for (let s = 1; s <= steps; s++) {
    pages.cover(tables, pos + 1);
    const prev = outs[outs.length - 1]?.tokenId ?? 0;
    const r = request(id, [prev], pos, tables, { sampling: { ...sampling, outputIndex: s } });
    outs.push(model.forward({ step: 100 + s, requests: [r] }, slabs).outputs[0] as ForwardOutput);
    pos += 1;
  }
  return outs;
}
