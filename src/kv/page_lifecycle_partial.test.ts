/**
 * The page lifecycle oracle on pages a transfer fills only in part (a decode page larger than the
 * prefill pages it receives: its tail past the transferred tokens is stale until zeroed). The clipped
 * tail zeroed after the landing, or written by the forward, raises nothing; forgetting it is I2; zeroing it
 * before the landing, over landed bytes or on a non-attention slab is I1 / I6.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { PageAccess, PageSpan } from '../device/types.ts';
import { PageLifecycle, type LifecycleViolation } from './page_lifecycle.ts';

const PAGE = 64;

function make(): { lc: PageLifecycle; seen: LifecycleViolation[] } {
  const seen: LifecycleViolation[] = [];
  return { lc: new PageLifecycle('D', 8, PAGE, true, [0, 1], (v) => seen.push(v)), seen };
}

/** A K/V page of 8 tokens x 4 B per region: K [0, 32), V [32, 64); the first `n` slots landed. */
const landed = (block: number, n: number): PageSpan[] =>
  [0, 1].flatMap((slab) => [
    { slab, block, start: 0, end: 4 * n },
    { slab, block, start: 32, end: 32 + 4 * n },
  ]);
const tail = (block: number, n: number): PageSpan[] =>
  [0, 1].flatMap((slab) => [
    { slab, block, start: 4 * n, end: 32 },
    { slab, block, start: 32 + 4 * n, end: 64 },
  ]);
const readAll = (block: number): PageAccess[] =>
  [0, 1].map((slab) => ({ slab, block, start: 0, end: PAGE, write: false }));
const codes = (seen: LifecycleViolation[]): string[] => [...new Set(seen.map((v) => v.invariant))];

function landPart(lc: PageLifecycle, block: number, n: number): void {
  lc.allocated([block], true);
  lc.inboundPosted(10, [block]);
  lc.inboundDone(10, [block], true, landed(block, n));
}

test('partial landing + the clipped tail zeroed after it: the forward reads only defined bytes (no violation)', () => {
  const { lc, seen } = make();
  landPart(lc, 3, 5);
  lc.spansZeroEnqueued(1, tail(3, 5));
  lc.forwardEnqueued(2, readAll(3));
  lc.spansZeroRan(1);
  lc.forwardRan(2);
  assert.deepEqual(seen, []);
});

test('I2: the clipped tail never zeroed: the forward reads stale bytes past the landed slots', () => {
  const { lc, seen } = make();
  landPart(lc, 3, 5);
  lc.forwardEnqueued(2, readAll(3));
  assert.deepEqual(codes(seen), ['I2']);
  assert.equal(seen.length, 1, 'one report per page');
  assert.match(seen[0]!.message, /filled only partly \(a clipped tail left stale\)/);
});

test('a forward writing the missing slot before reading it, or a whole landing, leaves nothing stale', () => {
  const { lc, seen } = make();
  landPart(lc, 3, 7);
  const slot7: PageAccess[] = [0, 1].flatMap((slab) => [
    { slab, block: 3, start: 28, end: 32, write: true },
    { slab, block: 3, start: 60, end: 64, write: true },
  ]);
  lc.forwardEnqueued(2, [...readAll(3), ...slot7]);
  landPart(lc, 4, 8);
  lc.forwardEnqueued(3, readAll(4));
  assert.deepEqual(seen, []);
});

test('I1: the tail zeroed while the transfer is still in flight, or over bytes the transfer landed', () => {
  const { lc, seen } = make();
  lc.allocated([3], true);
  lc.inboundPosted(10, [3]);
  lc.spansZeroEnqueued(1, tail(3, 5));
  assert.deepEqual(codes(seen), ['I1']);
  assert.match(seen[0]!.message, /zero-spans queued while transfer 10 writes the page/);
  const b = make();
  landPart(b.lc, 3, 5);
  b.lc.spansZeroEnqueued(1, tail(3, 4));
  assert.deepEqual(codes(b.seen), ['I1']);
  assert.match(b.seen[0]!.message, /wipes bytes \[16, 32\) of slab 0 that hold KV/);
});

test('I6 and stale zero-spans: a non-attention slab, a page not owned, an op that lands on the next owner', () => {
  const { lc, seen } = make();
  landPart(lc, 3, 5);
  lc.spansZeroEnqueued(1, [{ slab: 2, block: 3, start: 20, end: 32 }]);
  lc.spansZeroEnqueued(2, [{ slab: 0, block: 5, start: 20, end: 32 }]);
  assert.deepEqual(codes(seen), ['I6']);
  assert.equal(seen.length, 2);
  const b = make();
  landPart(b.lc, 3, 5);
  b.lc.spansZeroEnqueued(1, tail(3, 5));
  b.lc.freed([3]);
  b.lc.allocated([3], true);
  b.lc.spansZeroRan(1);
  assert.deepEqual(codes(b.seen), ['I1']);
  assert.match(b.seen[0]!.message, /earlier allocation/);
});
