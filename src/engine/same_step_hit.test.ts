/**
 * A request admitted in the same step as a running request's prefill chunk prefix-hits the pages that
 * chunk computes (the scheduler publishes pages when it allocates them). The model computes a step's
 * requests one after the other, new requests first: the new request read those pages before the running
 * request wrote them (zeros or stale bytes), and got other logits (other tokens on the mini presets).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { vocabSizeOf } from '../model/config.ts';
import { makeHarness, runAlone } from './runner_testkit.ts';
import { spreadPrompt } from './scheduler_testkit.ts';

for (const preset of ['dsv4-micro', 'llama-micro', 'llama-mini'] as const) {
  test(`${preset}: a prefix hit on pages a running chunk computes in the same step gives the same tokens as alone`, async () => {
    const prompt = spreadPrompt(100, 5).map((t) => t % (vocabSizeOf(preset) - 3));
    const sched = { maxNumBatchedTokens: 64 };
    const alone = await runAlone(preset, prompt, 4, sched);
    const h = await makeHarness(preset, 96, sched);
    h.add('a', prompt, 4);
    await h.step(); // a computes [0, 64)
    h.add('b', prompt, 4);
    const so = await h.step(); // a computes [64, 100); b hits a's pages up to 96, computes [96, 100)
    assert.equal(so.scheduledNewReqs[0]?.requestId, 'b');
    assert.equal(so.scheduledNewReqs[0]?.numComputedTokens, 96, 'b hit the pages a computes this step');
    await h.drain();
    assert.deepEqual(h.hashes.get('a'), alone.hashes);
    assert.deepEqual(h.tokens.get('b'), alone.tokens, 'b = alone (tokens)');
    assert.deepEqual(h.hashes.get('b'), alone.hashes, 'b = alone (logits)');
  });
}
