/**
 * Proves the deferred-free fence (vLLM #45357): pages released while steps are in flight come back to
 * the pool only after every step scheduled up to the release was processed, exactly once, in release
 * order; with no step in flight they come back at once.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { FreeFence } from './free_fence.ts';

function fence(): { f: FreeFence; released: number[][][] } {
  const released: number[][][] = [];
  return { f: new FreeFence((blocks) => released.push(blocks)), released };
}

test('free fence: with no step in flight (none scheduled yet, or all processed), defer releases at once', () => {
  const { f, released } = fence();
  f.defer([[1, 2], [3]]);
  assert.deepEqual(released, [[[1, 2], [3]]], 'before any step');
  f.scheduled(1);
  f.processed(1);
  assert.equal(f.inFlightSteps, 0);
  f.defer([[4], []]);
  assert.deepEqual(
    released,
    [
      [[1, 2], [3]],
      [[4], []],
    ],
    'after the only step was processed',
  );
  assert.equal(f.numPending, 0);
  f.defer([[], []]);
  assert.equal(released.length, 2, 'an empty release is no release');
});

test('free fence: exactly one step in flight: defer holds the pages until that step is processed, then releases them exactly once', () => {
  const { f, released } = fence();
  f.scheduled(1);
  f.processed(1);
  f.scheduled(2);
  assert.equal(f.inFlightSteps, 1);
  f.defer([[5, 6]]);
  assert.deepEqual(released, [], 'step 2 may still be writing the pages');
  assert.equal(f.numPending, 1);
  f.processed(2);
  assert.deepEqual(released, [[[5, 6]]], 'released once step 2 was processed');
  assert.equal(f.numPending, 0);
  f.processed(2);
  f.scheduled(3);
  f.processed(3);
  assert.deepEqual(released, [[[5, 6]]], 'never released a second time');
});

test('free fence: the scheduler’s order (defer inside updateFromOutput of step k, then processed(k)) with step k the only one in flight', () => {
  const { f, released } = fence();
  f.scheduled(1);
  f.defer([[7]]);
  assert.deepEqual(released, []);
  f.processed(1);
  assert.deepEqual(released, [[[7]]]);
});

test('free fence: two steps in flight: pages wait for the later one; releases come out in order, each once', () => {
  const { f, released } = fence();
  f.scheduled(1);
  f.scheduled(2);
  f.defer([[1]]); // fence: step 2
  f.processed(1);
  assert.deepEqual(released, [], 'step 2, scheduled before the release, is still in flight');
  f.scheduled(3);
  f.defer([[2]]); // fence: step 3
  f.processed(2);
  assert.deepEqual(released, [[[1]]], 'the first batch at its fence, not the second');
  f.scheduled(4);
  f.defer([[3]]); // fence: step 4
  f.processed(4); // steps 3 and 4 processed together
  assert.deepEqual(released, [[[1]], [[2]], [[3]]], 'both remaining batches, in release order');
  assert.equal(f.numPending, 0);
  assert.equal(f.inFlightSteps, 0);
});
