/**
 * The race checker's verdicts on the seed's shapes, against any device (part of the conformance
 * suite). The NIC is played by the test: it posts a work request to the checker, writes the page
 * bytes itself (as an RDMA NIC writes memory without the stream), and reports the completion.
 *
 * The planted race is DESIGN.md's: zeroing queued on the compute stream behind a long forward, a READ
 * landing in the same page, nothing ordering the two.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { letDevicesRun, page, withDevice, type DeviceFactory } from './conformance_support.ts';
import { RaceChecker } from './race/race_checker.ts';
import { rankStreamName } from './ranked_stream.ts';
import type { Device, OpSubmission, PageAccess } from './types.ts';

const READ_LABEL = { what: 'READ', requestIds: ['req-1'], step: 7 };
const SLAB = 0;
const BLOCK = 3;

function checkerOf(d: Device): RaceChecker {
  assert.ok(d.raceChecker instanceof RaceChecker, 'raceCheck: true must wire a RaceChecker');
  return d.raceChecker;
}

function wholePage(d: Device, write: boolean): PageAccess {
  return { slab: SLAB, block: BLOCK, start: 0, end: d.pageBytes, write };
}

/** The NIC lands a READ into (SLAB, BLOCK): post, write the bytes, return the work-request id. */
function nicWrite(d: Device, value: number): number {
  const wr = checkerOf(d).nicPost(READ_LABEL, [wholePage(d, true)]);
  page(d, SLAB, BLOCK).fill(value);
  return wr;
}

function zeroSub(): OpSubmission {
  return {
    op: { kind: 'zero', blockIds: [BLOCK], slabs: [0, 1] },
    label: { what: 'zero', requestIds: ['req-1'], step: 7 },
  };
}

function readKernel(d: Device): OpSubmission {
  return {
    op: { kind: 'kernel', name: 'sum', args: { slab: SLAB, block: BLOCK } },
    label: { what: 'forward', requestIds: ['req-1'], step: 7 },
    footprint: [wholePage(d, false)],
  };
}

export function registerRaceConformance(factory: DeviceFactory, ranks = 1): void {
  // SLAB is rank 0's (its first slab): the stream the checker names is rank 0's.
  const compute = rankStreamName('compute', 0, ranks);
  test('race: zero behind a long forward vs a NIC write with no ordering is reported (and here it wiped the READ)', async () => {
    await withDevice(
      factory,
      async (d) => {
        d.compute.enqueue({ op: { kind: 'sleep', ms: 200 }, label: { what: 'previous forward', step: 6 } });
        d.compute.enqueue(zeroSub());
        const wr = nicWrite(d, 0xab);
        checkerOf(d).nicObserved(wr);
        await d.synchronize();
        const races = checkerOf(d).races();
        assert.equal(races.length, 1, JSON.stringify(races));
        const [r] = races;
        assert.equal(r?.slab, SLAB);
        assert.equal(r?.block, BLOCK);
        assert.deepEqual(r?.range, { start: 0, end: d.pageBytes });
        assert.deepEqual([r?.a.agent, r?.a.label.what, r?.a.write], [compute, 'zero', true]);
        assert.deepEqual([r?.b.agent, r?.b.label.requestIds, r?.b.label.step, r?.b.write], ['nic', ['req-1'], 7, true]);
        // The stream was still in the previous forward when the READ landed, so the zeroing came after.
        assert.ok(
          page(d, SLAB, BLOCK).every((x) => x === 0),
          'the zeroing landed after the READ',
        );
      },
      true,
    );
  });

  test('race: the same ops ordered by an event (host waits on it before posting the READ) are not reported', async () => {
    await withDevice(
      factory,
      async (d) => {
        d.compute.enqueue({ op: { kind: 'sleep', ms: 50 }, label: { what: 'previous forward', step: 6 } });
        d.compute.enqueue(zeroSub());
        const ev = d.compute.recordEvent();
        await ev.wait();
        const wr = nicWrite(d, 0xab);
        checkerOf(d).nicObserved(wr);
        await d.synchronize();
        assert.deepEqual(checkerOf(d).races(), []);
        assert.ok(
          page(d, SLAB, BLOCK).every((x) => x === 0xab),
          'the READ survives',
        );
      },
      true,
    );
  });

  test('race: reported from the clocks even when the zero happened to finish before the READ', async () => {
    await withDevice(
      factory,
      async (d) => {
        d.compute.enqueue(zeroSub());
        await letDevicesRun(factory);
        const wr = nicWrite(d, 0x5c);
        checkerOf(d).nicObserved(wr);
        await d.synchronize();
        assert.ok(
          page(d, SLAB, BLOCK).every((x) => x === 0x5c),
          'in this run the bad interleaving did not occur',
        );
        assert.equal(checkerOf(d).races().length, 1);
      },
      true,
    );
  });

  test('race: awaiting the zero ticket before posting the READ orders them (no report)', async () => {
    await withDevice(
      factory,
      async (d) => {
        await d.compute.enqueue(zeroSub()).done;
        checkerOf(d).nicObserved(nicWrite(d, 1));
        assert.deepEqual(checkerOf(d).races(), []);
      },
      true,
    );
  });

  test('race: stream FIFO orders zero-then-kernel-read (no report)', async () => {
    await withDevice(
      factory,
      async (d) => {
        d.compute.enqueue(zeroSub());
        assert.equal(await d.compute.enqueue(readKernel(d)).done, 0);
        assert.deepEqual(checkerOf(d).races(), []);
      },
      true,
    );
  });

  test('race: the host observing the NIC completion orders the write before a later kernel read (no report)', async () => {
    await withDevice(
      factory,
      async (d) => {
        const wr = nicWrite(d, 2);
        checkerOf(d).nicObserved(wr);
        assert.equal(await d.compute.enqueue(readKernel(d)).done, 2 * d.pageBytes);
        assert.deepEqual(checkerOf(d).races(), []);
      },
      true,
    );
  });

  test('race: a kernel read of a page with a NIC write posted but not observed is reported', async () => {
    await withDevice(
      factory,
      async (d) => {
        nicWrite(d, 2);
        await d.compute.enqueue(readKernel(d)).done;
        const races = checkerOf(d).races();
        assert.equal(races.length, 1);
        assert.deepEqual(
          [races[0]?.a.agent, races[0]?.a.write, races[0]?.b.agent, races[0]?.b.write],
          ['nic', true, compute, false],
        );
        assert.equal(races[0]?.b.label.what, 'forward');
      },
      true,
    );
  });

  test('race: a clipped-tail zero-spans op is judged by its bytes: on bytes a posted READ writes it races, on the tail it does not; after the observed READ it is ordered', async () => {
    await withDevice(
      factory,
      async (d) => {
        const half = d.pageBytes / 2;
        const head = { slab: SLAB, block: BLOCK, start: 0, end: half, write: true };
        const tail = { slab: SLAB, block: BLOCK, start: half, end: d.pageBytes };
        const wr = checkerOf(d).nicPost(READ_LABEL, [head]);
        d.compute.enqueue({ op: { kind: 'zero-spans', spans: [tail] }, label: { what: 'zero-tail' } });
        await d.synchronize();
        assert.deepEqual(checkerOf(d).races(), [], 'disjoint bytes: no race even unordered');
        d.compute.enqueue({
          op: { kind: 'zero-spans', spans: [{ ...tail, start: half - 1 }] },
          label: { what: 'zero-tail' },
        });
        await d.synchronize();
        assert.equal(checkerOf(d).races().length, 1, 'one byte of the READ: a race');
        checkerOf(d).clear();
        checkerOf(d).nicObserved(wr);
        d.compute.enqueue({ op: { kind: 'zero-spans', spans: [{ ...tail, start: 0 }] }, label: { what: 'zero-tail' } });
        await d.synchronize();
        assert.deepEqual(checkerOf(d).races(), [], 'enqueued after the host observed the READ: ordered');
      },
      true,
    );
  });
}
