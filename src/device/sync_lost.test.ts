/**
 * After a compute thread died, the device is lost: whoever uses it next gets the loss as an operating error
 * (HandoffError INTERNAL with the reason, as enqueue and recordEvent do). synchronize() instead rejected with an
 * AssertionFailure 'synchronize on a closed device', as if the caller had a bug, because the death had marked the
 * device closed exactly as close() does.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { AssertionFailure } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';
import { createThreadedDevice } from './threaded.ts';

const KERNELS = new URL('./threaded_death_kernels.ts', import.meta.url).href;

test('threaded: synchronize() on a lost device rejects with the loss, not an AssertionFailure', async () => {
  const d = await createThreadedDevice({ numSlabs: 1, numBlocks: 4, pageBytes: 64, kernelModuleUrl: KERNELS });
  try {
    const t = d.compute.enqueue({ op: { kind: 'kernel', name: 'exitOnRank0', args: { ms: 0 } }, label: { what: 'k' } });
    await assert.rejects(t.done, /compute thread 0 exited/);
    await d.lost;
    await assert.rejects(
      d.synchronize(),
      (e: unknown) =>
        e instanceof HandoffError && !(e instanceof AssertionFailure) && /compute thread 0 exited/.test(e.message),
    );
  } finally {
    await d.close();
  }
  await assert.rejects(d.synchronize(), AssertionFailure, 'after close() it is a programmer error');
});
