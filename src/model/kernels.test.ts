/**
 * Proves the kernel module contract the device relies on: createKernels(init, slabs) builds a
 * `forward` kernel that works on slabs over SharedArrayBuffer, in this thread and inside a worker
 * thread (as the threaded device runs it), returns plain data, and equals the in-process model.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Worker } from 'node:worker_threads';
import type { KernelModule } from '../device/types.ts';
import { createKernels } from './kernels.ts';
import { createModel } from './model.ts';
import { kvConfigFor, makeSlabs, promptTokens, request } from './fixtures.ts';
import type { ForwardArgs, ForwardResult, ModelKernelInit } from './types.ts';

const init: ModelKernelInit = { preset: 'dsv4-mini', seed: 21, kvConfig: kvConfigFor('dsv4-mini', 16) };
const args: ForwardArgs = {
  step: 0,
  requests: [
    request('a', promptTokens(18, 1), 0, [
      [1, 2],
      [3, 4],
    ]),
    request('b', promptTokens(5, 2), 0, [[5], [6]], {
      sampling: { temperature: 1, topK: 40, seed: 3, outputIndex: 0 },
    }),
  ],
};

function expected(): { result: ForwardResult; slabs: Uint8Array[] } {
  const slabs = makeSlabs(init.kvConfig);
  const result = createModel(init.preset, init.seed, init.kvConfig).forward(args, slabs);
  return { result, slabs };
}

test('createKernels: forward on SharedArrayBuffer slabs equals the in-process model, result and page bytes', async () => {
  const slabs = makeSlabs(init.kvConfig, true);
  assert.ok(slabs[0]?.buffer instanceof SharedArrayBuffer);
  const kernels = await createKernels(structuredClone(init), slabs);
  assert.deepEqual(Object.keys(kernels), ['forward', 'matmul']);
  const result = kernels.forward?.(structuredClone(args), slabs) as ForwardResult;
  const want = expected();
  assert.deepEqual(result, want.result);
  assert.deepEqual(structuredClone(result), result, 'the result is plain data');
  slabs.forEach((s, i) => assert.deepEqual(new Uint8Array(s), want.slabs[i]));
});

test("the module satisfies the device's KernelModule type (checked by tsc) and exports createKernels", async () => {
  const mod: KernelModule = await import('./kernels.ts');
  assert.equal(typeof mod.createKernels, 'function');
});

test('createKernels: rejects slabs that do not match the KV config', async () => {
  await assert.rejects(createKernels(init, makeSlabs(kvConfigFor('dsv4-mini', 8))), /slab size/);
});

test('createKernels in a worker thread writes the shared slabs the host sees, and returns the same outputs', async () => {
  const slabs = makeSlabs(init.kvConfig, true);
  const source = `
    import { workerData, parentPort } from 'node:worker_threads';
    import { tsImport } from '${import.meta.resolve('tsx/esm/api')}';
    const mod = await tsImport(workerData.moduleUrl, import.meta.url);
    const slabs = workerData.buffers.map((b) => new Uint8Array(b));
    const kernels = await mod.createKernels(workerData.init, slabs);
    parentPort.postMessage(kernels.forward(workerData.args, slabs));
  `;
  const worker = new Worker(new URL(`data:text/javascript,${encodeURIComponent(source)}`), {
    workerData: {
      moduleUrl: new URL('./kernels.ts', import.meta.url).href,
      init,
      args,
      buffers: slabs.map((s) => s.buffer),
    },
  });
  const result = await new Promise<ForwardResult>((resolve, reject) => {
    worker.once('message', resolve);
    worker.once('error', reject);
  });
  await worker.terminate();
  const want = expected();
  assert.deepEqual(result, want.result);
  slabs.forEach((s, i) => assert.deepEqual(new Uint8Array(s), want.slabs[i], `slab ${i} as written by the worker`));
});
