/**
 * A compute thread that dies: with TP=2, close() after rank 0 died still stops rank 1's thread (it kept
 * running, and kept its process alive, because the death had marked the device closed and close() then
 * returned at once); a thread that dies of an uncaught non-Error value (`throw null`) fails its ticket with
 * the reason instead of crashing the host (the host's listener read `.message` of it); a gang kernel's
 * ticket settles only once every rank ran its part, even when one part failed at once (it rejected while
 * rank 1 still ran, and the host reused pages rank 1 then overwrote).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Worker } from 'node:worker_threads';
import { createThreadedDevice } from './threaded.ts';

const KERNELS = new URL('./threaded_death_kernels.ts', import.meta.url).href;
const tp2 = () =>
  createThreadedDevice({ numSlabs: 2, numBlocks: 4, pageBytes: 64, tensorParallelSize: 2, kernelModuleUrl: KERNELS });

test('TP=2: after rank 0 died, close() terminates the rank 1 thread too', async () => {
  const d = await tp2();
  // The device's threads are private: reached here only to watch rank 1's exit.
  const rank1 = (d as unknown as { workers: Worker[] }).workers[1] as Worker;
  let rank1Exited = false;
  rank1.on('exit', () => (rank1Exited = true));
  const t = d.compute.enqueue({ op: { kind: 'kernel', name: 'exitOnRank0', args: { ms: 300 } }, label: { what: 'k' } });
  await assert.rejects(t.done, /compute thread 0 exited/);
  await d.close();
  const alive = !rank1Exited;
  if (alive) await rank1.terminate(); // so this test process can exit either way
  assert.equal(alive, false, 'the rank 1 thread still ran after close()');
});

for (const value of [null, undefined]) {
  test(`a compute thread dying of an uncaught ${String(value)} fails its ticket, not the host`, async () => {
    const uncaught: unknown[] = [];
    const onUncaught = (e: unknown): void => void uncaught.push(e);
    process.on('uncaughtException', onUncaught);
    try {
      const d = await createThreadedDevice({ numSlabs: 1, numBlocks: 4, pageBytes: 64, kernelModuleUrl: KERNELS });
      const t = d.compute.enqueue({
        op: { kind: 'kernel', name: 'asyncThrow', args: { value } },
        label: { what: 'k' },
      });
      await assert.rejects(t.done, /compute thread 0 died/);
      await d.close();
      assert.deepEqual(uncaught, [], 'nothing thrown in the host');
    } finally {
      process.off('uncaughtException', onUncaught);
    }
  });
}

test('TP=2: a gang kernel whose rank 0 fails at once settles only after rank 1 ran its part', async () => {
  const d = await tp2();
  try {
    const t = d.compute.enqueue({
      op: { kind: 'kernel', name: 'failFastOnRank0', args: { ms: 300 } },
      label: { what: 'forward' },
    });
    await assert.rejects(t.done, /rank 0 failed/);
    assert.equal(d.compute.recordEvent().query(), true, 'nothing of the op still runs once its ticket settled');
    (d.slabs[1] as Uint8Array).fill(0x11, 0, 64); // the host reuses the page
    await d.synchronize();
    assert.equal((d.slabs[1] as Uint8Array)[0], 0x11, 'no late write over the reused page');
  } finally {
    await d.close();
  }
});
