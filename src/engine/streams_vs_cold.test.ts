/**
 * Bit-exactness against the COLD reference. random_streams.test.ts compares each
 * request with itself run alone under the same scheduler config, block size and TP degree; this compares
 * request streams (shared prefixes so prefix hits happen, chunked prefill with a small budget, lookahead,
 * async depth 1-2, block sizes 1-128, TP 1 or 2, temperature 0 and 0.8) with each request run alone at
 * TP 1, 16 tokens per page, one unchunked prefill and no prefix caching: tokens and logits must be equal.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { RealEnv } from '../util/env.ts';
import { KVCacheManager } from '../kv/kv_cache_manager.ts';
import type { ModelPreset } from '../kv/presets.ts';
import { NullConnector } from '../connector/base.ts';
import { ModelRunner, type StepHandle } from '../worker/model_runner.ts';
import type { SchedulerOutput } from '../worker/scheduler_output.ts';
import { kvCacheConfigOf, schedulerConfigOf } from './llm_engine.ts';
import { Request } from './request.ts';
import { Scheduler, type SchedulerConfig } from './scheduler.ts';
import { simDevice } from './devices.ts';

interface Geometry {
  blockSize: number;
  tp: number;
  numBlocks: number;
  depth: number;
  sched: Partial<SchedulerConfig>;
}

/** Every request's `token:logitsHash` list, the requests admitted together. */
async function runStream(preset: ModelPreset, g: Geometry, prompts: number[][], temps: number[], seeds: number[]) {
  const cfg = {
    preset,
    modelSeed: 1,
    numBlocks: g.numBlocks,
    blockSize: g.blockSize,
    tensorParallelSize: g.tp,
    asyncScheduling: true,
    scheduler: g.sched,
    idlePollMs: 1,
  };
  const kvConfig = kvCacheConfigOf(cfg);
  const schedCfg = schedulerConfigOf(cfg);
  const kv = new KVCacheManager(kvConfig, { enableCaching: schedCfg.enablePrefixCaching });
  const scheduler = new Scheduler(schedCfg, kv, new NullConnector(), new RealEnv(3));
  const runner = new ModelRunner(await simDevice(preset, 1)(kvConfig), kvConfig, null, 0);
  prompts.forEach((p, i) =>
    scheduler.addRequest(
      new Request({
        requestId: `r${i}`,
        promptTokenIds: p,
        sampling: {
          maxTokens: 5,
          temperature: temps[i] as number,
          seed: seeds[i] as number,
          stopTokenIds: [],
          ignoreEos: true,
        },
        arrivalMs: 0,
      }),
    ),
  );
  const out = new Map<string, string[]>();
  const queue: Array<{ so: SchedulerOutput; h: StepHandle }> = [];
  for (let s = 0; s < 2000 && (scheduler.hasWork() || queue.length > 0); s++) {
    while (queue.length < g.depth && scheduler.hasWork()) {
      const so = scheduler.schedule();
      queue.push({ so, h: await runner.executeModel(so) });
    }
    const head = queue.shift();
    if (!head) continue;
    for (const o of scheduler.updateFromOutput(head.so, await head.h.output)) {
      const got = o.newTokenIds.map((t, k) => `${t}:${o.logitsHashes[k]}`);
      out.set(o.requestId, [...(out.get(o.requestId) ?? []), ...got, ...(o.finishReason ? [o.finishReason] : [])]);
    }
  }
  return prompts.map((_, i) => out.get(`r${i}`) ?? []);
}

const COLD: Geometry = {
  blockSize: 16,
  tp: 1,
  numBlocks: 64,
  depth: 1,
  sched: { maxModelLen: 128, maxNumBatchedTokens: 512, enablePrefixCaching: false, enableChunkedPrefill: false },
};

test('property: streams with prefix hits, chunking, any block size and TP equal the cold one-shot TP=1 run', async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom<ModelPreset>('dsv4-micro', 'llama-micro', 'hybrid-micro'),
      fc.array(fc.nat(62), { maxLength: 60 }),
      fc.array(fc.record({ cut: fc.nat(60), tail: fc.array(fc.nat(62), { minLength: 1, maxLength: 30 }) }), {
        minLength: 1,
        maxLength: 4,
      }),
      fc.record({
        blockSize: fc.constantFrom(1, 2, 8, 64, 128),
        tp: fc.constantFrom(1, 2),
        pages16: fc.integer({ min: 12, max: 40 }),
        depth: fc.constantFrom(1, 2),
        budget: fc.integer({ min: 4, max: 44 }),
        maxNumSeqs: fc.integer({ min: 1, max: 4 }),
        lookahead: fc.nat(2),
      }),
      fc.array(fc.constantFrom(0, 0.8), { minLength: 4, maxLength: 4 }),
      async (preset, base, reqs, geo, temps) => {
        const prompts = reqs.map((r) => [...base.slice(0, r.cut), ...r.tail]);
        const seeds = prompts.map((_, i) => 10 + i);
        const cold: string[][] = [];
        for (let i = 0; i < prompts.length; i++)
          cold.push(
            (await runStream(preset, COLD, [prompts[i] as number[]], [temps[i] as number], [seeds[i] as number]))[0]!,
          );
        const g: Geometry = {
          blockSize: geo.blockSize,
          tp: geo.tp,
          numBlocks: Math.max(3, Math.ceil((geo.pages16 * 16) / geo.blockSize)),
          depth: geo.depth,
          sched: {
            maxModelLen: 128,
            maxNumBatchedTokens: geo.budget,
            enablePrefixCaching: true,
            enableChunkedPrefill: true,
            maxNumSeqs: geo.maxNumSeqs,
            numLookaheadTokens: geo.lookahead,
          },
        };
        const got = await runStream(preset, g, prompts, temps, seeds);
        prompts.forEach((_, i) => assert.deepEqual(got[i], cold[i], `request ${i} (${preset}) equals the cold run`));
      },
    ),
    { numRuns: Number(process.env.RUNS ?? 12), seed: process.env.SEED ? Number(process.env.SEED) : undefined },
  );
});
