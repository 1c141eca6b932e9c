/**
 * The engine view of the kv-layer fix (block_pool.ts uncache): a request that hit pages
 * whose forward then failed, and that was aborted (client gone) before the failure was seen, is no
 * longer a holder the failure handling can find; the pages it computed over the never-computed prefix
 * stayed in the prefix cache. Once the prefix was computed again (correctly) by another request, a
 * later request with the aborted one's prompt hit the whole chain, including those pages: it decoded
 * from KV computed over garbage. Before the fix the hit below was 64 tokens; now it stops at 48.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fakeRun, makeRequest, makeScheduler } from './scheduler_testkit.ts';

test('pages computed by an aborted request over a failed forward never serve a later prefix hit', () => {
  const { scheduler, kv } = makeScheduler({ numBlocks: 64 });
  const a = makeRequest(48, 3, null, 'a', 700); // tokens 700..747
  scheduler.addRequest(a);
  const s1 = scheduler.schedule();
  const b = makeRequest(80, 3, null, 'b', 700); // same tokens, longer: hits a's pages 0-2 (tokens 0-47)
  scheduler.addRequest(b);
  const s2 = scheduler.schedule();
  assert.equal(b.numLocalHitTokens, 48, "b hit a's three pages, published at allocation");
  assert.ok(scheduler.abortRequest('b'), 'the client of b went away while both steps ran');
  scheduler.updateFromOutput(s1, { ...fakeRun(s1), sampled: [], forwardErrors: { a: 'boom' } });
  scheduler.updateFromOutput(s2, fakeRun(s2));
  const c = makeRequest(48, 1, null, 'c', 700); // computes the shared prefix again, correctly
  scheduler.addRequest(c);
  for (let k = 0; k < 8 && scheduler.hasWork(); k++) {
    const s = scheduler.schedule();
    scheduler.updateFromOutput(s, fakeRun(s));
  }
  assert.ok(scheduler.isQuiescent());
  const hit = kv.getComputedBlocks({ requestId: 'probe', tokenIds: b.promptTokenIds }).numComputedTokens;
  assert.ok(hit <= 48, `a request with b's prompt hits ${hit} tokens: b's pages computed over a failed prefix`);
});
