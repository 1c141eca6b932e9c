/**
 * The threaded device passes the shared conformance suite, and its host is never blocked by the
 * stream: while a `sleep` holds the compute thread the host enqueues more and sees it not yet done.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { registerDeviceConformance } from './conformance.ts';
import { TEST_GEOMETRY } from './conformance_support.ts';
import { createThreadedDevice } from './threaded.ts';

registerDeviceConformance('threaded', (opts) => createThreadedDevice(opts));

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
