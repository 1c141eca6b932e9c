/**
 * The page lifecycle oracle on hand-written event sequences: the healthy READ and local-compute
 * lifecycles raise nothing, and each invariant (I1-I4, I6) fires on the sequence that breaks it; then
 * every violation site, one test each, against its minimal bad sequence and its nearest legal one.
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

const reads = (blocks: number[]): PageAccess[] =>
  blocks.map((block) => ({ slab: 0, block, start: 0, end: PAGE, write: false }));
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

// One test per violation site of the oracle: the minimal event sequence that breaks it reports exactly
// the expected violations (invariant, block, message), and the nearest legal sequence reports nothing.
// Deleting or weakening any single check makes its test fail (issue 11, item 9).

interface Site {
  /** What the site catches, as the test's name says it. */
  name: string;
  bad: (lc: PageLifecycle) => void;
  /** The violations `bad` raises, in order: [invariant, block, message]. */
  expect: Array<[LifecycleViolation['invariant'], number | null, RegExp]>;
  /** The nearest legal sequence: reports nothing. */
  good: (lc: PageLifecycle) => void;
}

const SITES: Site[] = [
  {
    name: 'allocated(): a page allocated twice without a free in between (I4)',
    bad: (lc) => {
      lc.allocated([1], true);
      lc.allocated([1], true);
    },
    expect: [['I4', 1, /allocated twice/]],
    good: (lc) => {
      lc.allocated([1], true);
      lc.freed([1]);
      lc.allocated([1], true);
    },
  },
  {
    name: 'freed(): a page freed while a transfer still writes into it (I4)',
    bad: (lc) => {
      lc.allocated([1], true);
      lc.inboundPosted(10, [1]);
      lc.freed([1]);
    },
    expect: [['I4', 1, /freed while transfer 10 is still writing into it/]],
    good: (lc) => {
      lc.allocated([1], true);
      lc.inboundPosted(10, [1]);
      lc.inboundDone(10, [1], true);
      lc.freed([1]);
    },
  },
  {
    name: 'freed(): a page freed while granted to a peer (I4)',
    bad: (lc) => {
      lc.allocated([1], true);
      lc.grant('t1', [1], true);
      lc.freed([1]);
    },
    expect: [['I4', 1, /freed while granted to a peer \(transfer t1\)/]],
    good: (lc) => {
      lc.allocated([1], true);
      lc.grant('t1', [1], true);
      lc.grant('t1', [1], false);
      lc.freed([1]);
    },
  },
  {
    name: 'zeroEnqueued(): a zero op that does not cover exactly the attention slabs (I6)',
    bad: (lc) => {
      lc.allocated([1], true);
      lc.zeroEnqueued(1, [1], [0]);
    },
    expect: [['I6', null, /zero op 1 covers slabs 0, attention slabs are 0,1/]],
    good: (lc) => {
      lc.allocated([1], true);
      lc.zeroEnqueued(1, [1], [1, 0]);
    },
  },
  {
    name: 'zeroEnqueued(): zeroing queued for a page the instance does not own (I6)',
    bad: (lc) => {
      lc.zeroEnqueued(1, [7], [0, 1]);
    },
    expect: [['I6', 7, /zeroing queued for a page the instance does not own \(op 1\)/]],
    good: (lc) => {
      lc.allocated([7], true);
      lc.zeroEnqueued(1, [7], [0, 1]);
      lc.zeroEnqueued(2, [0], [0, 1]);
    },
  },
  {
    name: 'zeroEnqueued(): zeroing queued while a transfer writes the page (I1)',
    bad: (lc) => {
      lc.allocated([1], true);
      lc.inboundPosted(10, [1]);
      lc.zeroEnqueued(1, [1], [0, 1]);
    },
    expect: [['I1', 1, /zeroing queued while transfer 10 writes the page \(op 1\)/]],
    // The same zeroing, of the neighbouring page: a READ into page 1 does not forbid zeroing page 2.
    good: (lc) => {
      lc.allocated([1, 2], true);
      lc.inboundPosted(10, [1]);
      lc.zeroEnqueued(1, [2], [0, 1]);
    },
  },
  {
    name: 'zeroRan(): a zeroing from an earlier allocation lands on the page’s new owner (I1)',
    bad: (lc) => {
      lc.allocated([1], true);
      lc.zeroEnqueued(1, [1], [0, 1]);
      lc.freed([1]);
      lc.allocated([1], true);
      lc.zeroRan(1);
    },
    expect: [['I1', 1, /zeroing from an earlier allocation \(op 1\) landed on the page's new owner/]],
    good: (lc) => {
      lc.allocated([1], true);
      lc.zeroEnqueued(1, [1], [0, 1]);
      lc.zeroRan(1);
      lc.freed([1]);
      lc.allocated([1], true);
    },
  },
  {
    name: 'zeroRan(): a zeroing that runs after a transfer landed wipes it (I1)',
    // Unreachable without first posting the READ over the queued zeroing (inboundPosted()'s report);
    // the wipe itself is the second, distinct report.
    bad: (lc) => {
      lc.allocated([1], true);
      lc.zeroEnqueued(1, [1], [0, 1]);
      lc.inboundPosted(10, [1]);
      lc.inboundDone(10, [1], true);
      lc.zeroRan(1);
    },
    expect: [
      ['I1', 1, /transfer 10 writes the page while its zeroing is still queued/],
      ['I1', 1, /zeroing \(op 1\) ran after a transfer landed and wiped it/],
    ],
    good: (lc) => {
      lc.allocated([1], true);
      lc.zeroEnqueued(1, [1], [0, 1]);
      lc.zeroRan(1);
      lc.inboundPosted(10, [1]);
      lc.inboundDone(10, [1], true);
    },
  },
  {
    name: 'forwardEnqueued(): a forward enqueued that reads a freed page (I4)',
    bad: (lc) => {
      lc.allocated([1], true);
      lc.zeroEnqueued(1, [1], [0, 1]);
      lc.zeroRan(1);
      lc.freed([1]);
      lc.forwardEnqueued(2, reads([1]));
    },
    expect: [['I4', 1, /forward \(op 2\) reads a freed page/]],
    good: (lc) => {
      lc.allocated([1], true);
      lc.zeroEnqueued(1, [1], [0, 1]);
      lc.zeroRan(1);
      lc.forwardEnqueued(2, reads([1]));
      lc.forwardRan(2);
      lc.freed([1]);
    },
  },
  {
    name: 'forwardEnqueued(): a forward enqueued that writes a freed page (I4)',
    bad: (lc) => {
      lc.allocated([1], true);
      lc.freed([1]);
      lc.forwardEnqueued(2, [slot(1)]);
    },
    expect: [['I4', 1, /forward \(op 2\) writes a freed page/]],
    good: (lc) => {
      lc.allocated([1], true);
      lc.forwardEnqueued(2, [slot(1)]);
    },
  },
  {
    name: 'forwardEnqueued(): a forward enqueued before a READ into its page landed (I3)',
    bad: (lc) => {
      lc.allocated([1], true);
      lc.inboundPosted(10, [1]);
      lc.forwardEnqueued(2, reads([1]));
    },
    expect: [['I3', 1, /forward \(op 2\) enqueued before transfer 10 into the page landed/]],
    good: (lc) => {
      lc.allocated([1], true);
      lc.inboundPosted(10, [1]);
      lc.inboundDone(10, [1], true);
      lc.forwardEnqueued(2, reads([1]));
    },
  },
  {
    name: 'forwardEnqueued(): a forward reads a fresh page neither zeroed nor landed (I2)',
    bad: (lc) => {
      lc.allocated([1], true);
      lc.forwardEnqueued(2, reads([1]));
    },
    expect: [['I2', 1, /forward \(op 2\) reads a page that was neither zeroed nor filled by a transfer/]],
    // Zeroing queued ahead of the forward on the same stream is enough (FIFO).
    good: (lc) => {
      lc.allocated([1], true);
      lc.zeroEnqueued(1, [1], [0, 1]);
      lc.forwardEnqueued(2, reads([1]));
    },
  },
  {
    name: 'forwardRan(): a forward wrote its page after the page was freed (I4)',
    bad: (lc) => {
      lc.allocated([1], true);
      lc.forwardEnqueued(2, [slot(1)]);
      lc.freed([1]);
      lc.forwardRan(2);
    },
    expect: [['I4', 1, /forward \(op 2\) wrote the page after it was freed$/]],
    good: (lc) => {
      lc.allocated([1], true);
      lc.forwardEnqueued(2, [slot(1)]);
      lc.forwardRan(2);
      lc.freed([1]);
    },
  },
  {
    name: 'forwardRan(): a forward wrote its page after the page was freed and reallocated to a new owner (I7)',
    bad: (lc) => {
      lc.allocated([1], true);
      lc.forwardEnqueued(2, [slot(1)]);
      lc.freed([1]);
      lc.allocated([1], true);
      lc.forwardRan(2);
    },
    expect: [['I7', 1, /stale writer: forward \(op 2\) enqueued for generation 1 wrote generation 2/]],
    good: (lc) => {
      lc.allocated([1], true);
      lc.forwardEnqueued(2, [slot(1)]);
      lc.forwardRan(2);
      lc.freed([1]);
      lc.allocated([1], true);
    },
  },
  {
    name: 'inboundPosted(): a transfer into a free page (I4)',
    bad: (lc) => {
      lc.inboundPosted(10, [1]);
    },
    expect: [['I4', 1, /transfer 10 targets a free page/]],
    good: (lc) => {
      lc.allocated([1], true);
      lc.inboundPosted(10, [1]);
    },
  },
  {
    name: 'inboundPosted(): a transfer that overwrites a prefix-hit page (I4)',
    bad: (lc) => {
      lc.allocated([1], false);
      lc.inboundPosted(10, [1]);
    },
    expect: [['I4', 1, /transfer 10 overwrites a prefix-hit page/]],
    good: (lc) => {
      lc.allocated([1], true);
      lc.inboundPosted(10, [1]);
    },
  },
  {
    name: 'inboundPosted(): a transfer into a page whose zeroing is still queued (I1)',
    bad: (lc) => {
      lc.allocated([1], true);
      lc.zeroEnqueued(1, [1], [0, 1]);
      lc.inboundPosted(10, [1]);
    },
    expect: [['I1', 1, /transfer 10 writes the page while its zeroing is still queued/]],
    good: (lc) => {
      lc.allocated([1], true);
      lc.zeroEnqueued(1, [1], [0, 1]);
      lc.zeroRan(1);
      lc.inboundPosted(10, [1]);
    },
  },
  {
    name: 'inboundDone(): a transfer landed in a freed page (I4)',
    // Freeing under the transfer is itself reported (freed()); the landing is a second, distinct report.
    bad: (lc) => {
      lc.allocated([1], true);
      lc.inboundPosted(10, [1]);
      lc.freed([1]);
      lc.inboundDone(10, [1], true);
    },
    expect: [
      ['I4', 1, /freed while transfer 10 is still writing/],
      ['I4', 1, /transfer 10 landed in a freed page/],
    ],
    good: (lc) => {
      lc.allocated([1], true);
      lc.inboundPosted(10, [1]);
      lc.inboundDone(10, [1], true);
      lc.freed([1]);
    },
  },
  {
    name: 'outboundRan(): a transfer read a producer page after it was freed (I4)',
    bad: (lc) => {
      lc.allocated([1], true);
      lc.outboundPosted(10, [1]);
      lc.freed([1]);
      lc.outboundRan(10, [1]);
    },
    expect: [['I4', 1, /transfer 10 read the page after it was freed/]],
    good: (lc) => {
      lc.allocated([1], true);
      lc.outboundPosted(10, [1]);
      lc.outboundRan(10, [1]);
      lc.freed([1]);
    },
  },
];

for (const site of SITES) {
  test(`site ${site.name} is reported with its invariant; the nearest legal sequence reports nothing`, () => {
    const bad = make();
    site.bad(bad.lc);
    assert.deepEqual(
      bad.seen.map((v) => [v.invariant, v.block]),
      site.expect.map(([inv, block]) => [inv, block]),
      bad.seen.map((v) => v.message).join('\n'),
    );
    site.expect.forEach(([, , msg], i) => assert.match(bad.seen[i]!.message.replace(/ \[history: .*\]$/, ''), msg));
    const good = make();
    site.good(good.lc);
    assert.deepEqual(good.seen, []);
  });
}

test('I2 on a recurrent state: a Mamba slab (not an attention slab) is read before the forward rewrites it', () => {
  // Slab 2 is not an attention slab: a Mamba state page, read whole then written whole by each forward.
  const state = (write: boolean): PageAccess => ({ slab: 2, block: 3, start: 0, end: PAGE, write });
  const { lc, seen } = make();
  lc.allocated([3], true);
  lc.forwardEnqueued(1, [state(false), state(true)]); // a state never landed nor written: stale bytes read
  assert.deepEqual(codes(seen), ['I2']);
  lc.forwardEnqueued(2, [state(false), state(true)]); // the state the last forward wrote
  assert.equal(seen.length, 1);
  // On an attention slab the forward's writes come first (its new slots), so the same footprint is legal.
  const attn = make();
  attn.lc.allocated([3], true);
  attn.lc.forwardEnqueued(1, [
    { slab: 0, block: 3, start: 0, end: PAGE, write: false },
    { slab: 0, block: 3, start: 0, end: PAGE, write: true },
  ]);
  assert.deepEqual(attn.seen, []);
});
