/**
 * Scheduler.isQuiescent() is the leak oracle of the engine's tests ("every page back": forward_failure,
 * failed_forward_uncache, ...; EngineCore.isIdle() wraps it for the server tests). It only checked that no
 * request, hold, fence entry or in-flight step was left, and inferred that every page was back in the
 * pool: a page that left the pool and never came back (held by no request any more) went unseen, so the
 * oracle could not fail on exactly the leak it is named for. This proves it now sees such a page.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fakeRun, makeRequest, makeScheduler } from './scheduler_testkit.ts';

test('isQuiescent is false while a page is out of the pool with no owner (a leaked page)', () => {
  const { scheduler, kv } = makeScheduler({ preset: 'llama-mini', numBlocks: 16 });
  scheduler.addRequest(makeRequest(20, 2, null, 'a'));
  for (let k = 0; k < 10 && scheduler.hasWork(); k++) {
    const so = scheduler.schedule();
    scheduler.updateFromOutput(so, fakeRun(so));
  }
  assert.ok(scheduler.isQuiescent(), 'a finished run is quiescent');
  // A page leaves the pool and its owner is forgotten without giving it back: the leak itself.
  assert.ok(kv.allocateSlots({ requestId: 'leak', tokenIds: [1, 2, 3] }, 3) !== null);
  kv.detach('leak');
  assert.equal(kv.getNumFreeBlocks(), 14, 'one page is out of the pool');
  assert.equal(scheduler.isQuiescent(), false, 'the leak check sees the page that never came back');
});
