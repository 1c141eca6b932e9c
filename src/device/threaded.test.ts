/**
 * The threaded device passes the shared conformance suite, and its host is never blocked by the
 * stream: while a `sleep` holds the compute thread the host enqueues more and sees it not yet done.
 * Its opt-in op log times ops in the compute thread, in FIFO order, and names them as race reports do.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { registerDeviceConformance } from './conformance.ts';
import { TEST_GEOMETRY } from './conformance_support.ts';
import type { RaceChecker } from './race/race_checker.ts';
import { createThreadedDevice, deviceTimeline } from './threaded.ts';

registerDeviceConformance('threaded', (opts) => createThreadedDevice(opts));
registerDeviceConformance('threaded TP=2', (opts) => createThreadedDevice({ ...opts, tensorParallelSize: 2 }), 2);

test('threaded: the host goes on while a sleep holds the stream (later op not done, then done after awaiting)', async () => {
  const d = await createThreadedDevice(TEST_GEOMETRY);
  try {
    d.slabs[0]!.fill(7);
    const sleep = d.compute.enqueue({ op: { kind: 'sleep', ms: 300 }, label: { what: 'long forward' } });
    const zero = d.compute.enqueue({ op: { kind: 'zero', blockIds: [2], slabs: [0] }, label: { what: 'zero' } });
    const ev = d.compute.recordEvent();
    // enqueue returned while the thread sleeps: the zero has not run and the event is not reached.
    assert.equal(ev.query(), false);
    assert.equal(d.slabs[0]![2 * d.pageBytes], 7);
    let zeroDone = false;
    void zero.done.then(() => (zeroDone = true));
    await sleep.done;
    await zero.done;
    assert.equal(zeroDone, true);
    assert.equal(ev.query(), true);
    assert.equal(d.slabs[0]![2 * d.pageBytes], 0);
  } finally {
    await d.close();
  }
});

test('threaded: a kernel module that fails to load makes createThreadedDevice reject with BAD_CONFIG', async () => {
  await assert.rejects(
    createThreadedDevice({ ...TEST_GEOMETRY, kernelModuleUrl: new URL('./no_such_kernels.ts', import.meta.url).href }),
    (e: Error & { code?: string }) => e.code === 'BAD_CONFIG' && /compute thread failed to start/.test(e.message),
  );
});

test('threaded op log: off until started; then every op timed in the thread, FIFO, and named by the race checker ids', async () => {
  const d = await createThreadedDevice({ ...TEST_GEOMETRY, raceCheck: true });
  try {
    const log = deviceTimeline(d);
    const checker = d.raceChecker as RaceChecker | null;
    assert.ok(log !== null && checker !== null);
    await d.compute.enqueue({ op: { kind: 'zero', blockIds: [1], slabs: [0] }, label: { what: 'before' } }).done;
    assert.deepEqual(log.timeline(), [], 'nothing is logged before startTimeline');
    log.startTimeline();
    const before = log.timelineNowMs();
    const sleep = d.compute.enqueue({ op: { kind: 'sleep', ms: 20 }, label: { what: 'long forward' } });
    const zero = d.compute.enqueue({
      op: { kind: 'zero', blockIds: [2, 3], slabs: [0, 1] },
      label: { what: 'zero', step: 4 },
    });
    // The host reads page 2 without waiting for the zero: the checker reports the op by its own id.
    checker.hostReadPages({ what: 'host read' }, [{ slab: 0, block: 2, start: 0, end: 8, write: false }]);
    await Promise.all([sleep.done, zero.done]);
    const [s, z] = log.timeline();
    assert.ok(s && z);
    assert.deepEqual(
      [s.opId, z.opId, s.kind, z.kind, z.blockIds, z.label.step],
      [sleep.id, zero.id, 'sleep', 'zero', [2, 3], 4],
    );
    for (const o of [s, z]) {
      assert.equal(o.state, 'done');
      assert.ok(
        o.startMs !== null &&
          o.endMs !== null &&
          o.enqueuedMs >= before &&
          o.startMs >= o.enqueuedMs &&
          o.endMs >= o.startMs,
        'enqueue, start and end in order on one clock',
      );
    }
    assert.ok((z.startMs as number) >= (s.endMs as number), 'FIFO: the zero starts after the sleep ends');
    const race = checker.races().find((r) => r.a.source === 'op');
    assert.ok(race, 'the unordered host read races with the zero');
    assert.equal(race.a.id, z.checkerOpId);
  } finally {
    await d.close();
  }
});
