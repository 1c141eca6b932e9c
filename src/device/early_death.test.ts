/**
 * A rank thread that dies after it reported ready but before the device was built (with TP>1: while a slower
 * rank still loads its kernel module) must make the device lost, not crash the host. Before the fix
 * startThread had removed its 'error'/'exit' listeners and the device had not attached its own yet: the
 * Worker's 'error' event, with no listener, became an uncaught exception in the host process, and the
 * device never learned the thread was gone (its `lost` never settled; ops on rank 0 would hang).
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createThreadedDevice } from './threaded.ts';

const KERNELS = new URL('./threaded_early_death_kernels.ts', import.meta.url).href;

test('TP=2: a rank dying between its ready and the device being built loses the device, not the host', async () => {
  const uncaught: unknown[] = [];
  const onUncaught = (e: unknown): void => void uncaught.push(e);
  process.on('uncaughtException', onUncaught);
  try {
    const d = await createThreadedDevice({
      numSlabs: 2,
      numBlocks: 4,
      pageBytes: 64,
      tensorParallelSize: 2,
      kernelModuleUrl: KERNELS,
    });
    try {
      assert.deepEqual(
        uncaught.map((e) => String(e)),
        [],
        'nothing thrown in the host',
      );
      // The device knows: new ops are refused with the death's reason (before the fix they went to a dead thread).
      assert.throws(
        () => d.compute.enqueue({ op: { kind: 'kernel', name: 'ok', args: {} }, label: { what: 'k' } }),
        (e: Error & { code?: string }) => e.code === 'INTERNAL' && /compute thread 0 died/.test(e.message),
      );
      assert.match((await (d.lost as Promise<Error>)).message, /compute thread 0 died: rank 0 died after start/);
    } finally {
      await d.close();
    }
  } finally {
    process.off('uncaughtException', onUncaught);
  }
});
