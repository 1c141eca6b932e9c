/**
 * Pages published at allocation by a step whose forward then failed must leave
 * the prefix cache even when their request is no longer there to be failed (aborted, or preempted to a
 * new epoch, while the step was in flight: async scheduling). Before the fix failForward returned early
 * for such a request, its never-computed pages stayed published, and a later request with the same
 * prefix hit them (its answer is not the cold run's).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fakeRun, makeRequest, makeScheduler } from './scheduler_testkit.ts';

test('a request aborted while its failing step is in flight: its pages do not serve a prefix hit', () => {
  const { scheduler, kv } = makeScheduler({ numBlocks: 64 });
  const a = makeRequest(48, 3, null, 'a', 700);
  scheduler.addRequest(a);
  const s1 = scheduler.schedule();
  assert.equal(s1.numScheduledTokens['a'], 48);
  scheduler.abortRequest('a'); // the client went away while step 1 runs
  scheduler.updateFromOutput(s1, { ...fakeRun(s1), sampled: [], forwardErrors: { a: 'boom' } });
  assert.equal(
    kv.getComputedBlocks({ requestId: 'probe', tokenIds: a.promptTokenIds }).numComputedTokens,
    0,
    'no page of the failed step is published',
  );
  const c = makeRequest(48, 3, null, 'c', 700);
  scheduler.addRequest(c);
  const s2 = scheduler.schedule();
  assert.equal(c.numLocalHitTokens, 0, 'c computes its prompt itself');
  scheduler.updateFromOutput(s2, fakeRun(s2));
});

test('a request that hit the pages of a request aborted with its failing step in flight fails too', () => {
  const { scheduler } = makeScheduler({ numBlocks: 64 });
  const a = makeRequest(48, 3, null, 'a', 700);
  scheduler.addRequest(a);
  const s1 = scheduler.schedule();
  const b = makeRequest(40, 3, null, 'b', 700); // hits a's first two pages, published at allocation
  scheduler.addRequest(b);
  const s2 = scheduler.schedule();
  assert.ok(b.numLocalHitTokens >= 32, `b hit a's pages (${b.numLocalHitTokens} tokens)`);
  scheduler.abortRequest('a');
  const outs = scheduler.updateFromOutput(s1, { ...fakeRun(s1), sampled: [], forwardErrors: { a: 'boom' } });
  assert.equal(outs.find((o) => o.requestId === 'b')?.error?.code, 'INTERNAL', 'b read pages never computed');
  scheduler.updateFromOutput(s2, fakeRun(s2));
  assert.ok(scheduler.isQuiescent(), 'every page back');
});

test('a request preempted while its failing step is in flight does not hit its own never-computed pages', () => {
  // dsv4-mini: 2 groups over one pool, pages of 16; 9 usable pages: x and a take 4 each, x's third page
  // (one per group) does not fit, so a, the newest, is preempted.
  const { scheduler, kv } = makeScheduler({ numBlocks: 10, config: { maxNumBatchedTokens: 64 } });
  const x = makeRequest(31, 8, null, 'x', 1); // 2 pages per group, its decode needs a third at token 32
  scheduler.addRequest(x);
  const s0 = scheduler.schedule();
  scheduler.updateFromOutput(s0, fakeRun(s0));
  const a = makeRequest(32, 3, null, 'a', 700); // 2 pages per group: 6 of 7 pages used
  scheduler.addRequest(a);
  const s1 = scheduler.schedule(); // x decodes (token 31 → 32 slots), a prefills
  assert.equal(s1.numScheduledTokens['a'], 32);
  // Step 1 in flight; step 2: x needs its third page; the pool has one per group short: a is preempted.
  const s2 = scheduler.schedule();
  assert.equal(a.status, 'PREEMPTED', 'a preempted while its step 1 is in flight');
  scheduler.updateFromOutput(s1, { ...fakeRun(s1), forwardErrors: { a: 'boom' } });
  assert.equal(
    kv.getComputedBlocks({ requestId: 'probe', tokenIds: a.promptTokenIds }).numComputedTokens,
    0,
    'no page of the failed step is published',
  );
  scheduler.updateFromOutput(s2, fakeRun(s2));
});
