/**
 * A request that hit pages a failed forward never computed is failed (its KV
 * is wrong), and so are the pages it computed itself over that prefix: they must leave the prefix cache
 * with it. Before the fix they stayed published; once the shared prefix was computed again (correctly),
 * a later request with the hitter's prompt hit the whole chain, including the pages computed over the
 * never-computed prefix, and its answer was not the cold run's.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fakeRun, makeRequest, makeScheduler } from './scheduler_testkit.ts';

test("pages computed by a request that hit a failed forward's pages do not serve a later prefix hit", () => {
  const { scheduler, kv } = makeScheduler({ numBlocks: 64 });
  const a = makeRequest(48, 3, null, 'a', 700); // tokens 700..747
  scheduler.addRequest(a);
  const s1 = scheduler.schedule();
  const b = makeRequest(80, 3, null, 'b', 700); // same tokens, longer: hits a's pages 0-2 (tokens 0-47)
  scheduler.addRequest(b);
  const s2 = scheduler.schedule();
  assert.equal(b.numLocalHitTokens, 48, "b hit a's three pages, published at allocation");
  const outs = scheduler.updateFromOutput(s1, { ...fakeRun(s1), sampled: [], forwardErrors: { a: 'boom' } });
  assert.equal(outs.find((o) => o.requestId === 'b')?.error?.code, 'INTERNAL', 'b read pages never computed');
  scheduler.updateFromOutput(s2, fakeRun(s2));
  // The shared prefix is computed again, correctly, by c (pages 0-2 published anew).
  const c = makeRequest(48, 1, null, 'c', 700);
  scheduler.addRequest(c);
  for (let k = 0; k < 8 && scheduler.hasWork(); k++) {
    const s = scheduler.schedule();
    scheduler.updateFromOutput(s, fakeRun(s));
  }
  assert.ok(scheduler.isQuiescent());
  // b's pages 3-4 (tokens 48-79) were computed over a's never-computed pages: a hit may reach c's pages
  // 0-2 but never b's past them.
  const hit = kv.getComputedBlocks({ requestId: 'probe', tokenIds: b.promptTokenIds }).numComputedTokens;
  assert.ok(hit <= 48, `a request with b's prompt hits ${hit} tokens: b's pages computed over a failed prefix`);
});
