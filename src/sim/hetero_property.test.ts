/**
 * Property test of a real P/D pair in one process (threaded devices, inproc NIC thread)
 * against the colocated TP=1 reference, token for token and logit for logit, over random block sizes on
 * each side (1 to 64), tensor parallel degrees (1 or 2 each), READ or WRITE (READ on the hybrid), chunked
 * prefill, decode lookahead, and prompts that share a prefix with one decode already cached (decode-side
 * prefix hits counted in decode's block size), sent one after the other or at once. The micro presets
 * keep it within seconds; every run also requires no load failure (nothing silently recomputed).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { RealEnv } from '../util/env.ts';
import { threadedDevice } from '../engine/devices.ts';
import { LLMEngine, type GenerateRequest } from '../engine/llm_engine.ts';
import { PdPair } from './pd_pair.ts';

const env = new RealEnv(23);
const PRESETS = ['dsv4-micro', 'hybrid-micro', 'llama-micro'] as const;
const run = (r: { tokenIds: number[]; logitsHashes: Array<string | null> }): string =>
  `${r.tokenIds.join(',')}|${r.logitsHashes.join(',')}`;

async function colocated(preset: (typeof PRESETS)[number], prompts: GenerateRequest[]): Promise<string[]> {
  const e = await LLMEngine.create(
    {
      preset,
      modelSeed: 4,
      numBlocks: 256,
      asyncScheduling: true,
      scheduler: {},
      idlePollMs: 2,
      makeDevice: threadedDevice(preset, 4),
    },
    env,
  );
  try {
    const out: string[] = [];
    for (const p of prompts) out.push(run(await e.generate(p)));
    return out;
  } finally {
    await e.close();
  }
}

const blockSize = fc.constantFrom(1, 2, 4, 8, 16, 32, 64);
const world = fc.record({
  preset: fc.constantFrom(...PRESETS),
  write: fc.boolean(),
  prefillBlockSize: blockSize,
  decodeBlockSize: blockSize,
  prefillTp: fc.constantFrom(1, 2),
  decodeTp: fc.constantFrom(1, 2),
  chunk: fc.constantFrom(7, 16, 512),
  lookahead: fc.constantFrom(0, 1, 3),
  together: fc.boolean(),
  base: fc.array(fc.integer({ min: 0, max: 62 }), { minLength: 1, maxLength: 90 }),
  rest: fc.array(fc.record({ keep: fc.nat(), tail: fc.array(fc.integer({ min: 0, max: 62 }), { maxLength: 30 }) }), {
    minLength: 2,
    maxLength: 3,
  }),
});

test('property: P/D at random block sizes, degrees, modes, chunking and decode prefix hits equals colocated', async () => {
  let n = 0;
  await fc.assert(
    fc.asyncProperty(world, async (w) => {
      const mode = w.preset === 'hybrid-micro' || !w.write ? 'read' : 'write';
      const prompts: GenerateRequest[] = [
        w.base,
        ...w.rest.map((r) => [...w.base.slice(0, r.keep % (w.base.length + 1)), ...r.tail]),
      ]
        .map((ids) => (ids.length > 0 ? ids : [5]))
        .map((promptTokenIds, i) => ({
          promptTokenIds,
          sampling: { maxTokens: 3, temperature: i % 2 ? 0.8 : 0, seed: 9 + i, ignoreEos: true },
        }));
      const want = await colocated(w.preset, prompts);
      const pair = await PdPair.create(
        {
          preset: w.preset,
          modelSeed: 4,
          numBlocks: 256,
          decode: { mode },
          raceCheck: true,
          name: `prop-${n++}`,
          prefillTp: w.prefillTp,
          decodeTp: w.decodeTp,
          prefillBlockSize: w.prefillBlockSize,
          decodeBlockSize: w.decodeBlockSize,
          scheduler: { maxNumBatchedTokens: w.chunk },
          decodeScheduler: { numLookaheadTokens: w.lookahead },
        },
        env,
      );
      try {
        const one = (p: GenerateRequest) => (mode === 'read' ? pair.generate(p) : pair.generateWrite(p));
        const got = [run(await one(prompts[0] as GenerateRequest))];
        if (w.together) got.push(...(await Promise.all(prompts.slice(1).map(one))).map(run));
        else for (const p of prompts.slice(1)) got.push(run(await one(p)));
        assert.deepEqual(got, want);
        assert.equal(pair.decode.scheduler.stats.loadFailures, 0, 'no load failed');
        assert.deepEqual((pair.decode.device.raceChecker as unknown as { races(): unknown[] }).races(), []);
      } finally {
        await pair.close();
      }
    }),
    { numRuns: 3, seed: 20260, endOnFailure: true },
  );
});
