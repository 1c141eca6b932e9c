/**
 * The page lifecycle oracle on hand-written event sequences: the healthy READ and local-compute
 * lifecycles raise nothing, and each invariant (I1-I4, I6) fires on the sequence that breaks it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { PageAccess } from '../device/types.ts';
import { PageLifecycle, type LifecycleViolation } from './page_lifecycle.ts';

const PAGE = 64;

function make(zeroing = true): { lc: PageLifecycle; seen: LifecycleViolation[] } {
  const seen: LifecycleViolation[] = [];
  return { lc: new PageLifecycle('D', 8, PAGE, zeroing, [0, 1], (v) => seen.push(v)), seen };
}

const reads = (blocks: number[]): PageAccess[] => blocks.map((block) => ({ slab: 0, block, start: 0, end: PAGE, write: false }));
const slot = (block: number): PageAccess => ({ slab: 0, block, start: 0, end: 8, write: true });
const codes = (seen: LifecycleViolation[]): string[] => [...new Set(seen.map((v) => v.invariant))];

test('healthy lifecycles raise nothing: zero → forward → free, and READ → landed → forward → free', () => {
  const { lc, seen } = make();
  lc.allocated([1, 2], true);
  lc.zeroEnqueued(1, [1], [0, 1]);
  lc.inboundPosted(10, [2]);
  lc.inboundDone(10, [2], true);
  lc.forwardEnqueued(2, [...reads([1, 2]), slot(1)]);
  assert.equal(lc.state(1), 'zero-queued');
  lc.zeroRan(1);
  lc.forwardRan(2);
  assert.equal(lc.state(1), 'in-use');
  assert.equal(lc.state(2), 'landed');
  lc.freed([1, 2]);
  assert.equal(lc.state(2), 'freed');
  assert.deepEqual(seen, []);
  assert.equal(lc.allocatedCount(), 0);
});

test('I1: a READ into a page whose zeroing is still queued, and a zeroing that runs after the READ landed', () => {
  const { lc, seen } = make();
  lc.allocated([3], true);
  lc.zeroEnqueued(1, [3], [0, 1]);
  lc.inboundPosted(10, [3]);
  lc.inboundDone(10, [3], true);
  lc.zeroRan(1);
  assert.deepEqual(codes(seen), ['I1']);
  assert.equal(seen.length, 2);
  assert.match(seen[1]!.message, /wiped/);
});

test('I1: a zeroing queued for an earlier owner that lands after the page was reallocated', () => {
  const { lc, seen } = make();
  lc.allocated([4], true);
  lc.zeroEnqueued(1, [4], [0, 1]);
  lc.freed([4]);
  lc.allocated([4], true);
  lc.zeroRan(1);
  assert.deepEqual(codes(seen), ['I1']);
});

test('I2: a forward reads a fresh page that was neither zeroed nor landed (stale bytes); not when zeroing is off', () => {
  const bad = make();
  bad.lc.allocated([5], true);
  bad.lc.forwardEnqueued(1, reads([5]));
  assert.deepEqual(codes(bad.seen), ['I2']);
  const uniform = make(false);
  uniform.lc.allocated([5], true);
  uniform.lc.forwardEnqueued(1, reads([5]));
  assert.deepEqual(uniform.seen, []);
});

test('I3: a forward enqueued while a READ into its page is still in flight', () => {
  const { lc, seen } = make();
  lc.allocated([2], true);
  lc.inboundPosted(10, [2]);
  lc.forwardEnqueued(1, reads([2]));
  assert.deepEqual(codes(seen), ['I3']);
});

test('I4: freeing a page with a READ in flight or a live grant, a transfer into a prefix-hit page, a forward writing a freed page', () => {
  const { lc, seen } = make();
  lc.allocated([1, 2, 3], true);
  lc.inboundPosted(10, [1]);
  lc.grant('t1', [2], true);
  lc.freed([1, 2]);
  assert.equal(seen.filter((v) => v.invariant === 'I4').length, 2);
  lc.grant('t1', [2], false);
  lc.allocated([6], false);
  lc.inboundPosted(11, [6]);
  assert.match(seen[2]!.message, /prefix-hit/);
  lc.forwardEnqueued(2, [slot(3)]);
  lc.freed([3]);
  lc.forwardRan(2);
  assert.match(seen[seen.length - 1]!.message, /wrote the page after it was freed/);
  assert.deepEqual(codes(seen), ['I4']);
});

test('I4: a transfer reading a producer page after it was freed; nothing when the page is still held', () => {
  const { lc, seen } = make();
  lc.allocated([1], true);
  lc.outboundPosted(10, [1]);
  lc.outboundRan(10, [1]);
  assert.deepEqual(seen, []);
  lc.outboundPosted(11, [1]);
  lc.freed([1]);
  assert.deepEqual(seen, [], 'a queued READ whose grant is gone is harmless until it reads');
  lc.outboundRan(11, [1]);
  assert.deepEqual(codes(seen), ['I4']);
});

test('I6: zeroing the wrong slabs, or a page the instance does not own', () => {
  const { lc, seen } = make();
  lc.allocated([1], true);
  lc.zeroEnqueued(1, [1], [0]);
  lc.zeroEnqueued(2, [7], [0, 1]);
  assert.deepEqual(codes(seen), ['I6']);
  assert.equal(seen.length, 2);
});
