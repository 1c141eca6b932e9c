/**
 * RequestTransfers: a sync load is unresolved until its step is processed; an async load resumes only
 * after finishedRecving; held pages come back exactly once; an id with a transfer in flight is known.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RequestTransfers } from './request_transfers.ts';

test('sync load: unresolved until its step is taken; other steps leave it alone', () => {
  const t = new RequestTransfers();
  t.syncLoadStarted('a', 3);
  t.syncLoadStarted('b', 4);
  assert.ok(t.isSyncLoading('a'));
  assert.deepEqual(t.takeSyncLoadsOf(2), []);
  assert.deepEqual(t.takeSyncLoadsOf(3), ['a']);
  assert.ok(!t.isSyncLoading('a') && t.isSyncLoading('b'));
  assert.ok(!t.has('a') && t.has('b'));
});

test('async load: finishedRecving before resume; a stray report for another request is ignored', () => {
  const t = new RequestTransfers();
  t.asyncLoadStarted('w');
  assert.equal(t.takeRecvFinished('w'), false, 'not before the WRITE landed');
  t.recvFinished('other');
  t.recvFinished('w');
  assert.equal(t.takeRecvFinished('w'), true);
  assert.equal(t.takeRecvFinished('w'), false, 'consumed once');
  assert.ok(!t.has('w'));
});

test('held pages come back once; the id stays known while held', () => {
  const t = new RequestTransfers();
  t.hold('p', [[1, 2], [3]]);
  assert.ok(t.has('p'));
  assert.equal(t.numHeld, 1);
  assert.deepEqual(t.release('p'), [[1, 2], [3]]);
  assert.equal(t.release('p'), null);
  assert.equal(t.numHeld, 0);
});
