/**
 * The race checker on its own: NIC requests are not falsely ordered with each other, reads never
 * race with reads, byte ranges matter, events order streams, memory stays bounded over a long run,
 * reports are deduplicated and capped. The property test checks the checker against a brute-force
 * happens-before graph (race_oracle.test_support.ts) on random programs.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { RaceChecker } from './race_checker.ts';
import { formatRace } from './race_report.ts';
import { commandArb, runAgainstOracle } from './race_oracle.ts';
import type { PageAccess } from '../types.ts';

const PAGE = 64;
const w = (block: number, start = 0, end = PAGE, slab = 0): PageAccess => ({ slab, block, start, end, write: true });
const r = (block: number, start = 0, end = PAGE, slab = 0): PageAccess => ({ slab, block, start, end, write: false });

function checker(): RaceChecker {
  const c = new RaceChecker();
  c.addStream('compute');
  return c;
}

test('NIC requests are not ordered with each other: observing one does not order a read behind another', () => {
  const c = checker();
  c.nicPost({ what: 'READ a' }, [w(1)]);
  const b = c.nicPost({ what: 'READ b' }, [w(2)]);
  c.nicObserved(b);
  c.hostEnqueue('compute', { what: 'forward' }, [r(2)]);
  assert.deepEqual(c.races(), [], 'block 2 was observed');
  c.hostEnqueue('compute', { what: 'forward' }, [r(1)]);
  assert.deepEqual(
    c.races().map((x) => [x.a.label.what, x.block]),
    [['READ a', 1]],
  );
});

test('two unobserved NIC writes to the same bytes race; reads never race with reads', () => {
  const c = checker();
  c.nicPost({ what: 'read-src' }, [r(5)]);
  c.hostEnqueue('compute', { what: 'reader' }, [r(5)]);
  assert.deepEqual(c.races(), []);
  c.nicPost({ what: 'w1' }, [w(6)]);
  c.nicPost({ what: 'w2' }, [w(6)]);
  assert.deepEqual(
    c.races().map((x) => [x.a.label.what, x.b.label.what, x.a.agent, x.b.agent]),
    [['w1', 'w2', 'nic', 'nic']],
  );
});

test('byte ranges: disjoint ranges of one page do not race, overlapping ones report the overlap', () => {
  const c = checker();
  c.nicPost({ what: 'READ' }, [w(3, 0, 32)]);
  c.hostEnqueue('compute', { what: 'tail' }, [r(3, 32, 64)]);
  assert.deepEqual(c.races(), []);
  c.hostEnqueue('compute', { what: 'middle' }, [r(3, 16, 48)]);
  assert.deepEqual(
    c.races().map((x) => x.range),
    [{ start: 16, end: 32 }],
  );
});

test('events order streams: a wait on an event recorded after a write orders a second stream behind it', () => {
  for (const wait of [true, false]) {
    const c = checker();
    c.addStream('copy');
    c.hostEnqueue('copy', { what: 'swap-in' }, [w(4)]);
    const ev = c.recordEvent('copy');
    if (wait) c.streamWaitEvent('compute', ev);
    c.hostEnqueue('compute', { what: 'forward' }, [r(4)]);
    assert.equal(c.races().length, wait ? 0 : 1, `wait=${wait}`);
  }
});

test('a stream waiting on a NIC completion event is ordered behind the write without the host observing it', () => {
  const c = checker();
  const wr = c.nicPost({ what: 'READ' }, [w(1)]);
  c.streamWaitEvent('compute', c.nicCompletionEvent(wr));
  c.hostEnqueue('compute', { what: 'forward' }, [r(1)]);
  assert.deepEqual(c.races(), []);
  c.hostReadPages({ what: 'host peek' }, [r(1)]);
  assert.equal(c.races().length, 1, 'the host itself never observed the write');
});

test('host accesses: a host read after a posted NIC write races until the host observes the completion', () => {
  const c = checker();
  const wr = c.nicPost({ what: 'READ' }, [w(2)]);
  c.hostReadPages({ what: 'checksum' }, [r(2)]);
  assert.equal(c.races().length, 1);
  c.nicObserved(wr);
  c.hostReadPages({ what: 'checksum again' }, [r(2)]);
  assert.equal(c.races().length, 1);
  assert.match(
    formatRace(c.races()[0]!),
    /race on slab 0 block 2 .*write by nic nic#1 'READ'.*read by host host#1 'checksum'/,
  );
});

test('bounded memory: 5,000 correctly ordered steps keep shadow entries, clocks and NIC lanes small, with no race', () => {
  const c = checker();
  for (let step = 0; step < 5000; step++) {
    const block = step % 16;
    c.hostEnqueue('compute', { what: 'zero', step }, [w(block), w(block, 0, PAGE, 1)]);
    const ev = c.recordEvent('compute');
    c.hostWaitEvent(ev);
    const wrs = [0, 1].map((slab) => c.nicPost({ what: 'READ', step }, [w(block, 0, PAGE, slab)]));
    wrs.reverse().forEach((id) => c.nicObserved(id));
    const fwd = c.hostEnqueue('compute', { what: 'forward', step }, [
      r(block),
      r(block, 0, PAGE, 1),
      w((block + 1) % 16, 0, 8),
    ]);
    if (step % 3 === 0) c.hostWaitOp(fwd);
  }
  const s = c.stats();
  assert.deepEqual(c.races(), []);
  assert.ok(s.shadowEntries <= 2 * 16 * 3, `shadow entries ${s.shadowEntries}`);
  assert.ok(s.opClocks <= 2048 && s.eventClocks <= 2048 && s.nicClocks <= 2048, JSON.stringify(s));
  assert.ok(s.nicLanes <= 2, `NIC lanes ${s.nicLanes}`);
});

test('reports: one per (op pair, slab, block), ranges merged; capped by racesMax; clear() forgets but keeps finding', () => {
  const c = new RaceChecker({ racesMax: 3 });
  c.addStream('compute');
  c.hostEnqueue('compute', { what: 'zero' }, [w(1), w(1, 0, PAGE, 1)]);
  c.nicPost({ what: 'READ' }, [w(1, 0, 8), w(1, 40, 48), w(1, 0, PAGE, 1)]);
  assert.deepEqual(
    c.races().map((x) => [x.slab, x.range]),
    [
      [0, { start: 0, end: 48 }],
      [1, { start: 0, end: PAGE }],
    ],
  );
  c.nicPost({ what: 'READ 2' }, [w(2)]);
  c.nicPost({ what: 'READ 3' }, [w(2)]);
  c.nicPost({ what: 'READ 4' }, [w(2)]);
  assert.equal(c.races().length, 3);
  assert.equal(c.stats().droppedReports, 2);
  c.clear();
  assert.deepEqual(c.races(), []);
  c.hostEnqueue('compute', { what: 'forward' }, [r(2)]);
  assert.equal(
    c.races().length,
    3,
    'the shadow memory survived clear(): the read races with all three unordered writes',
  );
});

test('programmer errors: unknown stream, empty range and unknown ids are assertions', () => {
  const c = checker();
  assert.throws(() => c.hostEnqueue('nope', { what: 'x' }, []), /unknown stream/);
  assert.throws(() => c.hostEnqueue('compute', { what: 'x' }, [w(0, 5, 5)]), /bad access range/);
  assert.throws(() => c.hostWaitOp(99), /unknown op id/);
  assert.throws(() => c.nicObserved(7), /unknown NIC work request id/);
});

test('property: on random programs the checker reports exactly the accesses a brute-force happens-before graph says race', () => {
  fc.assert(
    fc.property(fc.array(commandArb, { minLength: 1, maxLength: 80 }), (cmds) => {
      runAgainstOracle(cmds);
    }),
    { numRuns: 2000 },
  );
});
