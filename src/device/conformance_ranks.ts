/**
 * Device conformance for tensor parallel ranks (part of the suite when the factory's devices have
 * several): ops fan out by slab ownership, the race checker sees one stream per rank with that rank's
 * part of each footprint, kernels learn their ranks, and on a device whose ranks live in separate
 * executors (threaded) the collective gathers in rank order and recovers from a rank that gives up.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { page, TEST_GEOMETRY, withDevice, type DeviceFactory } from './conformance_support.ts';
import { RaceChecker } from './race/race_checker.ts';
import { rankStreamName } from './ranked_stream.ts';
import type { Device, OpSubmission } from './types.ts';

const kernel = (name: string, args: unknown = {}): OpSubmission => ({
  op: { kind: 'kernel', name, args },
  label: { what: name },
  footprint: [],
});

function checkerOf(d: Device): RaceChecker {
  assert.ok(d.raceChecker instanceof RaceChecker);
  return d.raceChecker;
}

export function registerRankConformance(factory: DeviceFactory, ranks: number): void {
  const perRank = TEST_GEOMETRY.numSlabs / ranks;
  const last = ranks - 1;
  const lastSlab = TEST_GEOMETRY.numSlabs - 1;

  test(`ranks: kernels learn ${ranks} ranks; a zero over every rank's slabs clears them all, and its rank parts race apart`, async () => {
    await withDevice(
      factory,
      async (d) => {
        const info = (await d.compute.enqueue(kernel('echoRanks')).done) as { size: number; ranks: number[] };
        assert.equal(info.size, ranks);
        assert.ok(info.ranks.includes(0), 'the result is rank 0 executor’s');
        page(d, 0, 2).fill(9);
        page(d, lastSlab, 2).fill(9);
        d.compute.enqueue({ op: { kind: 'sleep', ms: 30 }, label: { what: 'previous forward' } });
        d.compute.enqueue({ op: { kind: 'zero', blockIds: [2], slabs: [0, lastSlab] }, label: { what: 'zero' } });
        // A NIC write into the last rank's slab, unordered with the zeroing: reported on that rank's stream only.
        const wr = checkerOf(d).nicPost({ what: 'READ' }, [
          { slab: lastSlab, block: 2, start: 0, end: 8, write: true },
        ]);
        checkerOf(d).nicObserved(wr);
        await d.synchronize();
        assert.ok(page(d, 0, 2).every((b) => b === 0) && page(d, lastSlab, 2).every((b) => b === 0));
        const races = checkerOf(d).races();
        assert.equal(races.length, 1, JSON.stringify(races));
        assert.equal(races[0]?.a.agent, rankStreamName('compute', last, ranks));
        assert.equal(races[0]?.slab, lastSlab);
      },
      true,
    );
  });

  test('ranks: a kernel is a gang (one result, every rank past it) and a rank’s zero does not wait for the others', async () => {
    await withDevice(factory, async (d) => {
      page(d, perRank * last, 1).fill(3);
      const sum = await d.compute.enqueue({ ...kernel('sum', { slab: perRank * last, block: 1 }) }).done;
      assert.equal(sum, 3 * d.pageBytes, 'rank 0 reads the last rank’s slab too: slabs are shared memory');
      const ev = d.compute.recordEvent();
      await ev.wait();
      assert.equal(ev.query(), true);
    });
  });

  test('ranks: the collective (when ranks run apart) gathers in rank order, and recovers after a rank gives up', async () => {
    await withDevice(factory, async (d) => {
      const info = (await d.compute.enqueue(kernel('echoRanks')).done) as { ranks: number[]; collective: boolean };
      const gathered = await d.compute.enqueue(kernel('gather')).done;
      if (!info.collective) {
        assert.deepEqual(
          info.ranks,
          Array.from({ length: ranks }, (_, r) => r),
          'one executor computes every rank',
        );
        assert.equal(gathered, null);
        return;
      }
      const order = Array.from({ length: ranks }, (_, r) => r + 1);
      assert.deepEqual(gathered, order);
      for (const rank of [last, 0]) {
        const r = (await d.compute.enqueue(kernel('failOn', { rank })).done) as Record<string, unknown>;
        assert.deepEqual(r, { agreed: true, threw: rank !== 0, after: order }, `rank ${rank} gives up`);
      }
      assert.deepEqual(await d.compute.enqueue(kernel('gather')).done, order);
    });
  });
}
