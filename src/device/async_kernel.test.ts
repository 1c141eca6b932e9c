/**
 * A kernel may return a promise, and the stream holds for it (threaded_worker.ts): an op enqueued after it runs
 * after it settles, and an event recorded behind it is reached only then. The threaded device does this; the
 * sim device settled the ticket with the promise but went on at once, so a zero queued behind the kernel ran
 * first and the kernel's late write survived it (and the event behind both was reached before the kernel ended).
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createSimDevice } from './sim.ts';
import { createThreadedDevice } from './threaded.ts';
import type { Device, DeviceOptions } from './types.ts';

const OPTS: DeviceOptions = {
  numSlabs: 2,
  numBlocks: 4,
  pageBytes: 64,
  kernelModuleUrl: new URL('./threaded_async_kernels.ts', import.meta.url).href,
  kernelInit: { pageBytes: 64 },
};

const factories: Array<[string, () => Promise<Device>]> = [
  ['threaded', () => createThreadedDevice(OPTS)],
  [
    'sim',
    async () => {
      const d = createSimDevice({ ...OPTS, autoRun: true });
      await d.kernelsLoaded;
      return d;
    },
  ],
  [
    'sim TP=2',
    async () => {
      const d = createSimDevice({ ...OPTS, autoRun: true, tensorParallelSize: 2 });
      await d.kernelsLoaded;
      return d;
    },
  ],
];

for (const [name, make] of factories) {
  test(`${name}: an op queued behind a kernel that returns a promise runs after the promise settled`, async () => {
    const d = await make();
    try {
      const order: string[] = [];
      const k = d.compute.enqueue({ op: { kind: 'kernel', name: 'lateWrite', args: {} }, label: { what: 'k' } });
      const z = d.compute.enqueue({ op: { kind: 'zero', blockIds: [0], slabs: [0] }, label: { what: 'zero' } });
      const ev = d.compute.recordEvent();
      void k.done.then(() => order.push('kernel'));
      void z.done.then(() => order.push('zero'));
      void ev.wait().then(() => order.push('event'));
      assert.equal(await k.done, 7);
      await z.done;
      await ev.wait();
      assert.deepEqual(order, ['kernel', 'zero', 'event']);
      assert.ok(
        (d.slabs[0] as Uint8Array).subarray(0, 64).every((b) => b === 0),
        'the zero ran after the late write',
      );
    } finally {
      await d.close();
    }
  });
}
