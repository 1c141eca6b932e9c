/**
 * I7, page ownership epochs, on hand-written event sequences: every allocation starts a new generation
 * of the page, a write lands only on the generation it was posted for, and a page's generation may end
 * (be freed) only when no peer can still write it. Each check has its minimal bad sequence and its
 * nearest legal one (which must stay silent), so weakening any of them fails a test.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { PageLifecycle, type LifecycleViolation } from './page_lifecycle.ts';

function make(): { lc: PageLifecycle; seen: LifecycleViolation[] } {
  const seen: LifecycleViolation[] = [];
  return { lc: new PageLifecycle('D', 8, 64, true, [0, 1], (v) => seen.push(v)), seen };
}
const codes = (seen: LifecycleViolation[]): string[] => seen.map((v) => v.invariant);

test('I7: a READ posted for one owner that lands after the page was freed and reallocated is a stale writer', () => {
  const { lc, seen } = make();
  lc.allocated([2], true);
  lc.inboundPosted(10, [2], 'self', 'd-0');
  lc.freed([2]); // our own READ in flight at the free: I4 (the local use-after-free)
  lc.allocated([2], true);
  lc.inboundDone(10, [2], true);
  assert.deepEqual(codes(seen), ['I4', 'I7']);
  assert.match(seen[1]!.message, /stale writer: transfer 10 posted for d-0 at generation 1 landed on generation 2/);
});

test('I7: a transfer that lands on the generation it was posted for is legal, however many generations came before', () => {
  const { lc, seen } = make();
  for (let k = 0; k < 3; k++) {
    lc.allocated([2], true);
    lc.inboundPosted(10 + k, [2], 'self', `d-${k}`);
    lc.inboundDone(10 + k, [2], true);
    lc.freed([2]);
  }
  assert.deepEqual(seen, []);
});

test('I7: a page freed while the peer may still WRITE it (a WRITE in flight, a WRITE grant) is a stale writer', () => {
  const { lc, seen } = make();
  lc.allocated([1, 2], true);
  lc.inboundPosted(10, [1], 'peer', 'd-0');
  lc.grant('xfer-0', [2], true, true);
  lc.freed([1, 2]);
  assert.deepEqual(codes(seen), ['I7', 'I7']);
  assert.match(seen[0]!.message, /generation 1 freed while the peer may still write it \(WRITE 10 in flight\)/);
  assert.match(seen[1]!.message, /\(grant xfer-0\)/);
});

test('I7 nearest legal: the WRITE landed and the WRITE grant was revoked before the free', () => {
  const { lc, seen } = make();
  lc.allocated([1], true);
  lc.grant('xfer-0', [1], true, true);
  lc.inboundPosted(10, [1], 'peer', 'd-0');
  lc.inboundDone(10, [1], true);
  lc.grant('xfer-0', [1], false, true);
  lc.freed([1]);
  assert.deepEqual(seen, []);
});

test('I7 nearest legal: a WRITE queued under a grant that ended (revoked and drained) holds nothing up: the free, a new owner posting and reading, its refusal', () => {
  const { lc, seen } = make();
  lc.allocated([1], true);
  lc.grant('xfer-0', [1], true, true);
  lc.inboundPosted(10, [1], 'peer', 'd-0', 'xfer-0');
  lc.grant('xfer-0', [1], false, true);
  lc.freed([1]);
  lc.inboundPosted(11, [1], 'peer', 'd-0', 'xfer-0'); // posted late, into the free page: it will be refused
  lc.allocated([1], true);
  lc.inboundPosted(12, [1], 'self', 'd-1');
  lc.inboundDone(12, [1], true);
  lc.forwardEnqueued(1, [{ slab: 0, block: 1, start: 0, end: 64, write: false }]);
  lc.inboundDone(10, [1], false);
  lc.inboundDone(11, [1], false);
  assert.deepEqual(seen, []);
});

test('I7: that WRITE landing after all (the revoke did not stop it) is still a stale writer', () => {
  const { lc, seen } = make();
  lc.allocated([1], true);
  lc.grant('xfer-0', [1], true, true);
  lc.inboundPosted(10, [1], 'peer', 'd-0', 'xfer-0');
  lc.grant('xfer-0', [1], false, true);
  lc.freed([1]);
  lc.allocated([1], true);
  lc.inboundDone(10, [1], true);
  assert.deepEqual(codes(seen), ['I7']);
  assert.match(
    seen[0]!.message,
    /stale writer: transfer 10 posted for d-0 at generation 1 landed after its grant ended \(on generation 2\)/,
  );
});

test('I7: a WRITE in flight under a grant still live at the free is a stale writer', () => {
  const { lc, seen } = make();
  lc.allocated([1], true);
  lc.grant('xfer-0', [1], true, true);
  lc.inboundPosted(10, [1], 'peer', 'd-0', 'xfer-0');
  lc.freed([1]);
  assert.deepEqual(codes(seen), ['I7']);
  assert.match(seen[0]!.message, /WRITE 10 in flight, grant xfer-0/);
});

test('a READ grant (the peer reads the page) at the free stays I4, not a stale writer', () => {
  const { lc, seen } = make();
  lc.allocated([1], true);
  lc.grant('xfer-0', [1], true);
  lc.freed([1]);
  assert.deepEqual(codes(seen), ['I4']);
});
