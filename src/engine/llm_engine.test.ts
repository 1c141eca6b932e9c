/**
 * A colocated engine end to end (scheduler → runner → device stream → model): deterministic tokens for
 * every preset on the real threaded device, the same tokens on the in-process sim device, batch
 * invariance under concurrency and chunked prefill, and no page leaked at the end.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { MODEL_PRESETS, type ModelPreset } from '../kv/presets.ts';
import { vocabSizeOf } from '../model/config.ts';
import { LLMEngine, type EngineCreateConfig } from './llm_engine.ts';
import { simDevice, threadedDevice } from './devices.ts';

function config(
  preset: ModelPreset,
  kind: 'threaded' | 'sim',
  over: Partial<EngineCreateConfig> = {},
): EngineCreateConfig {
  return {
    preset,
    modelSeed: 1,
    numBlocks: 96,
    asyncScheduling: true,
    scheduler: { maxNumBatchedTokens: 64, maxNumSeqs: 8 },
    idlePollMs: 2,
    makeDevice: kind === 'threaded' ? threadedDevice(preset, 1) : simDevice(preset, 1),
    ...over,
  };
}

/** Token ids below min(50000, the preset's vocabulary). */
const promptFor = (preset: ModelPreset, n: number, base: number): number[] =>
  Array.from({ length: n }, (_, i) => (base * 131 + i * 7919) % Math.min(50000, vocabSizeOf(preset)));
const prompt = (n: number, base: number): number[] => promptFor('dsv4-mini', n, base);

for (const preset of MODEL_PRESETS) {
  const prompt = (n: number, base: number): number[] => promptFor(preset, n, base);
  test(`${preset}: threaded and sim devices give the same tokens and logits; batching and chunking change nothing`, async () => {
    const env = new RealEnv(3);
    const threaded = await LLMEngine.create(config(preset, 'threaded'), env);
    const sim = await LLMEngine.create(config(preset, 'sim'), env);
    try {
      const reqs = [prompt(5, 1), prompt(40, 2), prompt(90, 3), prompt(17, 4)].map((p, i) => ({
        promptTokenIds: p,
        sampling: { maxTokens: 6, temperature: i % 2 === 0 ? 0 : 0.8, seed: 11 + i, ignoreEos: true },
      }));
      // Alone, one at a time.
      const alone = [];
      for (const r of reqs) alone.push(await threaded.generate(r));
      // Concurrently (batched, chunked at 64 tokens per step), on both devices.
      const batched = await Promise.all(reqs.map((r) => threaded.generate(r)));
      const onSim = await Promise.all(reqs.map((r) => sim.generate(r)));
      for (let i = 0; i < reqs.length; i++) {
        assert.equal(alone[i]?.tokenIds.length, 6);
        assert.equal(alone[i]?.nanLogits, false);
        assert.deepEqual(batched[i]?.tokenIds, alone[i]?.tokenIds, `request ${i}: batched = alone`);
        assert.deepEqual(batched[i]?.logitsHashes, alone[i]?.logitsHashes, `request ${i}: logits equal`);
        assert.deepEqual(onSim[i]?.logitsHashes, alone[i]?.logitsHashes, `request ${i}: sim device = threaded device`);
      }
      // Nothing leaked once idle.
      for (let k = 0; k < 50 && !threaded.core.isIdle(); k++) await env.sleep(5);
      assert.ok(threaded.core.isIdle());
      assert.equal(threaded.kv.getNumFreeBlocks(), 95);
    } finally {
      await threaded.close();
      await sim.close();
    }
  });
}
