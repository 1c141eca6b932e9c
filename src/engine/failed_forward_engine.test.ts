/**
 * End to end on the engine: a request whose step fails as a whole while the
 * client has already gone (aborted after the step was scheduled, before its output was processed)
 * leaves no page in the prefix cache. Before the fix its pages, published at allocation and never
 * computed, served the next request with the same prompt, whose tokens and logits then differed from a
 * cold run's.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { FAILING_KERNELS_URL, FAIL_STEP_PREFIX } from '../worker/kernels_testkit.ts';
import { LLMEngine, type GenerateRequest } from './llm_engine.ts';
import { simDevice } from './devices.ts';
import { smallEngineConfig, spreadPrompt } from './scheduler_testkit.ts';

const config = () => smallEngineConfig(simDevice('dsv4-mini', 1, { kernelModuleUrl: FAILING_KERNELS_URL }));
const prompt = spreadPrompt(70, 9);
const req = (id: string): GenerateRequest => ({
  requestId: id,
  promptTokenIds: prompt,
  sampling: { maxTokens: 4, temperature: 0, ignoreEos: true },
});
const run = (r: { tokenIds: number[]; logitsHashes: Array<string | null> }) => ({
  tokenIds: r.tokenIds,
  logitsHashes: r.logitsHashes,
});

test('a failed step whose request was aborted while it ran serves no prefix hit: the next request equals a cold run', async () => {
  const env = new RealEnv(5);
  const cold = await LLMEngine.create(config(), env);
  let reference;
  try {
    reference = run(await cold.generate(req('cold')));
  } finally {
    await cold.close();
  }
  const e = await LLMEngine.create(config(), env);
  try {
    const failing = `${FAIL_STEP_PREFIX}a`;
    const schedule = e.scheduler.schedule.bind(e.scheduler);
    e.scheduler.schedule = () => {
      const so = schedule();
      // The client goes away once the step is on its way (the loop awaits the runner next).
      if (so.numScheduledTokens[failing] !== undefined) queueMicrotask(() => e.abort(failing));
      return so;
    };
    const gone = await e.generate(req(failing)).catch((err: unknown) => err);
    assert.ok(
      !Array.isArray((gone as { tokenIds?: unknown }).tokenIds) ||
        (gone as { tokenIds: number[] }).tokenIds.length === 0,
    );
    for (let k = 0; k < 400 && !e.core.isIdle(); k++) await env.sleep(5);
    const after = run(await e.generate(req('b')));
    assert.deepEqual(after, reference, 'same prompt after the failed step: the cold run, token for token');
  } finally {
    await e.close();
  }
});
