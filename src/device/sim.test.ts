/**
 * The sim device passes the shared conformance suite (with autoRun), and without autoRun it executes
 * nothing until the simulator says so: readyOps / runOp / runAll, deterministic and clock-free.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { registerDeviceConformance } from './conformance.ts';
import { gateEvent, TEST_GEOMETRY } from './conformance_support.ts';
import { createSimDevice } from './sim.ts';
import * as testKernels from './test_kernels.ts';

registerDeviceConformance('sim', async (opts) => {
  const d = createSimDevice({ ...opts, autoRun: true });
  await d.kernelsLoaded;
  return d;
});

registerDeviceConformance(
  'sim TP=2',
  async (opts) => {
    const d = createSimDevice({ ...opts, autoRun: true, tensorParallelSize: 2 });
    await d.kernelsLoaded;
    return d;
  },
  2,
);

const kernelOpts = { ...TEST_GEOMETRY, kernels: testKernels, kernelInit: { pageBytes: TEST_GEOMETRY.pageBytes } };

test('sim: nothing runs until runOp; readyOps shows only the head op; runOp settles its ticket', async () => {
  const d = createSimDevice(kernelOpts);
  d.slabs[1]!.fill(9);
  const a = d.compute.enqueue({ op: { kind: 'sleep', ms: 12 }, label: { what: 'forward', step: 1 } });
  const b = d.compute.enqueue({ op: { kind: 'zero', blockIds: [0], slabs: [1] }, label: { what: 'zero' } });
  await Promise.resolve();
  assert.deepEqual(d.readyOps(), [
    { id: a.id, rank: null, stream: 'compute', label: { what: 'forward', step: 1 }, kind: 'sleep', sleepMs: 12 },
  ]);
  assert.throws(() => d.runOp(b.id), /not ready/);
  d.runOp(a.id);
  assert.equal(d.slabs[1]![0], 9, 'the zero has not run');
  assert.deepEqual(
    d.readyOps().map((r) => r.id),
    [b.id],
  );
  d.runOp(b.id);
  assert.equal(d.slabs[1]![0], 0);
  await Promise.all([a.done, b.done]);
  assert.deepEqual(d.readyOps(), []);
  await d.close();
});

test('sim: a stream waiting on an unreached foreign event has no ready op until the event is reached', () => {
  const d = createSimDevice(kernelOpts);
  const gate = gateEvent();
  d.compute.waitEvent(gate);
  d.compute.enqueue({ op: { kind: 'kernel', name: 'stamp', args: { slab: 0, block: 0 } }, label: { what: 'stamp' } });
  assert.deepEqual(d.readyOps(), []);
  assert.equal(d.runAll(), 0);
  gate.open();
  assert.equal(d.runAll(), 1);
  assert.equal(d.slabs[0]![0], 1);
  assert.equal(d.pendingItems(), 0);
});

test('sim: the same program gives the same ids, ready lists and bytes on every run (deterministic)', async () => {
  const run = async (): Promise<string> => {
    const d = createSimDevice({ ...kernelOpts, raceCheck: true });
    const trace: string[] = [];
    for (let i = 0; i < 5; i++) {
      const t = d.compute.enqueue({
        op: { kind: 'kernel', name: 'pattern', args: { slab: i % 3, block: i, seed: i } },
        label: { what: 'p' },
        footprint: [],
      });
      trace.push(`e${t.id}`);
      if (i % 2 === 0) d.compute.recordEvent();
    }
    while (d.readyOps().length > 0) {
      const [r] = d.readyOps();
      trace.push(`r${r!.id}`);
      d.runOp(r!.id);
    }
    await d.synchronize();
    trace.push(Buffer.from(d.slabs.flatMap((s) => [...s])).toString('base64'));
    return trace.join(' ');
  };
  assert.equal(await run(), await run());
});

test('sim: a kernel module whose createKernels is async gates kernel ops until it is loaded', async () => {
  const d = createSimDevice({ ...TEST_GEOMETRY, kernels: { createKernels: async () => ({ one: () => 1 }) } });
  const t = d.compute.enqueue({ op: { kind: 'kernel', name: 'one', args: null }, label: { what: 'one' } });
  assert.deepEqual(d.readyOps(), []);
  await d.kernelsLoaded;
  assert.equal(d.runAll(), 1);
  assert.equal(await t.done, 1);
});

test('sim TP=2: a zero is one ready part per rank (run apart, in any order); a kernel is ready once, when it heads both', async () => {
  const d = createSimDevice({ ...kernelOpts, tensorParallelSize: 2 });
  await d.kernelsLoaded;
  d.slabs[0]!.fill(5);
  d.slabs[3]!.fill(5);
  const zero = d.compute.enqueue({ op: { kind: 'zero', blockIds: [1], slabs: [0, 3] }, label: { what: 'zero' } });
  const sum = d.compute.enqueue({
    op: { kind: 'kernel', name: 'sum', args: { slab: 3, block: 1 } },
    label: { what: 'f' },
  });
  const executed: number[] = [];
  d.compute.observe({ enqueued: () => {}, executed: (id) => executed.push(id) });
  await Promise.resolve();
  const ready = (): Array<[number, number | null, string]> => d.readyOps().map((r) => [r.id, r.rank, r.stream]);
  assert.deepEqual(ready(), [
    [zero.id, 0, 'compute.r0'],
    [zero.id, 1, 'compute.r1'],
  ]);
  d.runOp(zero.id, 1);
  assert.equal(d.slabs[3]![64], 0, "rank 1's part ran");
  assert.equal(d.slabs[0]![64], 5, "rank 0's part has not");
  assert.deepEqual(executed, [], 'the op is executed only when every part is');
  assert.deepEqual(ready(), [[zero.id, 0, 'compute.r0']], "the kernel waits for rank 0's stream");
  d.runOp(zero.id, 0);
  assert.deepEqual(executed, [zero.id]);
  assert.deepEqual(ready(), [[sum.id, null, 'compute.r0']]);
  d.runOp(sum.id);
  assert.equal(await sum.done, 0);
  assert.equal(d.pendingItems(), 0);
});
