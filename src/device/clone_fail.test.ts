/**
 * An op whose kernel args cannot cross to the compute thread (a DataCloneError) is refused at enqueue with an
 * AssertionFailure, and must leave the stream as if it had never been enqueued. Before the fix the refused op
 * kept its stream seq and ticket: an event recorded next on the idle stream was not reached (and, without a
 * later op, synchronize() never settled), and the worker stayed ref'd with one item "pending" forever.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { AssertionFailure } from '../util/assert.ts';
import { TEST_GEOMETRY, TEST_KERNELS_URL } from './conformance_support.ts';
import { createThreadedDevice } from './threaded.ts';

for (const tp of [1, 2]) {
  test(`threaded TP=${tp}: a refused (uncloneable) op leaves the idle stream idle`, async () => {
    const d = await createThreadedDevice({
      ...TEST_GEOMETRY,
      kernelModuleUrl: TEST_KERNELS_URL,
      kernelInit: { pageBytes: TEST_GEOMETRY.pageBytes },
      tensorParallelSize: tp,
      timeline: true,
    });
    try {
      assert.equal(
        await d.compute.enqueue({
          op: { kind: 'kernel', name: 'sum', args: { slab: 0, block: 0 } },
          label: { what: 'sum' },
        }).done,
        0,
      );
      assert.throws(
        () => d.compute.enqueue({ op: { kind: 'kernel', name: 'sum', args: { f: () => 1 } }, label: { what: 'bad' } }),
        AssertionFailure,
      );
      assert.equal(d.compute.recordEvent().query(), true, 'nothing is pending on an idle stream');
      await d.synchronize();
      // The stream goes on, and the op log holds no entry for the refused op.
      assert.equal(
        await d.compute.enqueue({
          op: { kind: 'kernel', name: 'stamp', args: { slab: 0, block: 1 } },
          label: { what: 'stamp' },
        }).done,
        1,
      );
      const log = (d as unknown as { timeline(): Array<{ state: string }> }).timeline();
      assert.deepEqual(
        log.map((o) => o.state),
        ['done', 'done'],
      );
    } finally {
      await d.close();
    }
  });
}
