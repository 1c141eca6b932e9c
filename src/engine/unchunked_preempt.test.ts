/**
 * Chunked prefill off: addRequest refuses prompts over the step budget, but a request preempted after it
 * produced tokens must recompute prompt + outputs in one step. Once that is over the budget it can never
 * be admitted again: it stays at the head of the waiting queue forever (and holds up the requests behind it).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fakeRun, makeRequest, makeScheduler } from './scheduler_testkit.ts';

test('chunked prefill off: a request preempted once its tokens exceed the step budget still finishes', () => {
  const { scheduler, kv } = makeScheduler({
    preset: 'llama-mini',
    numBlocks: 7, // null + 6 pages: two requests of up to 50 tokens (4 pages each) cannot both grow
    config: { enableChunkedPrefill: false, maxNumBatchedTokens: 32, maxModelLen: 100, enablePrefixCaching: false },
  });
  const a = makeRequest(30, 20, null, 'a', 1);
  const b = makeRequest(30, 20, null, 'b', 500);
  scheduler.addRequest(a);
  scheduler.addRequest(b);
  const finished = new Map<string, string>();
  let steps = 0;
  for (; steps < 300 && scheduler.hasWork(); steps++) {
    const so = scheduler.schedule();
    for (const o of scheduler.updateFromOutput(so, fakeRun(so)))
      if (o.finishReason) finished.set(o.requestId, o.finishReason);
  }
  assert.ok(scheduler.stats.preemptions > 0, 'b was preempted');
  assert.equal(finished.get('a'), 'length');
  assert.equal(finished.get('b'), 'length', 'b finishes after its preemption');
  assert.ok(scheduler.isQuiescent());
  assert.equal(kv.getNumFreeBlocks(), 6);
});
