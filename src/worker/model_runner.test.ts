/**
 * Proves the runner's step order on the compute stream (DESIGN.md §6, "every READ of a step is awaited
 * before that step's forward"): the forward is enqueued only after the connector's preForward has
 * returned, while the step's zeroing, enqueued before, may already run. Observed on the sim device
 * without autoRun: nothing executes until the test drains the stream, so the labels drained are
 * exactly the ops the runner had enqueued by then.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Deferred } from '../device/deferred.ts';
import { createSimDevice, type SimDevice } from '../device/sim.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import type { ConnectorWorkerHooks, LoadResult } from './hooks.ts';
import * as workerKernels from './kernels.ts';
import { ModelRunner } from './model_runner.ts';
import { emptyConnectorOutput, makeEmptySchedulerOutput, type SchedulerOutput } from './scheduler_output.ts';

const NO_FAILURES: LoadResult = { failedReqIds: [], invalidBlockIds: [], loadErrors: {} };

/** A connector worker side whose preForward of each step returns only when the test resolves it. */
class GatedHooks implements ConnectorWorkerHooks {
  readonly loads = new Map<number, Deferred<LoadResult>>();
  readonly calls: string[] = [];

  gate(step: number): Deferred<LoadResult> {
    let g = this.loads.get(step);
    if (g === undefined) {
      g = new Deferred<LoadResult>();
      this.loads.set(step, g);
    }
    return g;
  }
  preForward(so: SchedulerOutput): Promise<LoadResult> {
    this.calls.push(`preForward ${so.step}`);
    return this.gate(so.step).promise;
  }
  async postForward(so: SchedulerOutput) {
    this.calls.push(`postForward ${so.step}`);
    return emptyConnectorOutput();
  }
  hasPendingWork(): boolean {
    return [...this.loads.values()].some((g) => !g.settled);
  }
}

async function setup(): Promise<{ d: SimDevice; runner: ModelRunner; hooks: GatedHooks }> {
  const kvConfig = makeKVCacheConfig(presetKVGroups('dsv4-mini'), 16);
  const d = createSimDevice({
    numSlabs: kvConfig.numSlabs,
    numBlocks: kvConfig.numBlocks,
    pageBytes: kvConfig.pageBytes,
    kernels: workerKernels,
    kernelInit: { preset: 'dsv4-mini', seed: 3, kvConfig },
  });
  await d.kernelsLoaded;
  const hooks = new GatedHooks();
  const runner = new ModelRunner(d, kvConfig, hooks);
  assert.deepEqual(drain(d), ['zero-warmup']);
  return { d, runner, hooks };
}

/** Run every op the stream holds, in order; their labels (what/step). */
function drain(d: SimDevice): string[] {
  const ran: string[] = [];
  for (let ready = d.readyOps(); ready.length > 0; ready = d.readyOps()) {
    const op = ready[0]!;
    ran.push(op.label.step === undefined ? op.label.what : `${op.label.what} ${op.label.step}`);
    d.runOp(op.id);
  }
  return ran;
}

/** Let every pending promise continuation run (several event-loop turns). */
async function turns(n = 5): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise<void>((resolve) => setImmediate(resolve));
}

const PROMPT = Array.from({ length: 20 }, (_, i) => (i * 7919) % 50000);

/** Step 1: prefill of r1 (20 tokens: pages 1-2 of group 0, 3-4 of group 1), all four pages zeroed. */
function prefillStep(): SchedulerOutput {
  const so = makeEmptySchedulerOutput(1);
  so.scheduledNewReqs = [
    {
      requestId: 'r1',
      tokenIds: PROMPT,
      numPromptTokens: PROMPT.length,
      blockIds: [
        [1, 2],
        [3, 4],
      ],
      numComputedTokens: 0,
      sampling: { maxTokens: 4, temperature: 0, seed: 0, stopTokenIds: [], ignoreEos: true },
      numOutputTokens: 0,
    },
  ];
  so.numScheduledTokens = { r1: PROMPT.length };
  so.totalNumScheduledTokens = PROMPT.length;
  so.sampleAfter = { r1: true };
  so.newBlockIdsToZero = [1, 2, 3, 4];
  return so;
}

/** Step 2: r1's first decode (token 20 opens page 5 of group 0, 6 of group 1, both zeroed). */
function decodeStep(): SchedulerOutput {
  const so = makeEmptySchedulerOutput(2);
  so.scheduledCachedReqs = [
    { requestId: 'r1', newBlockIds: [[5], [6]], numComputedTokens: PROMPT.length, newTokenIds: [], numOutputTokens: 1 },
  ];
  so.numScheduledTokens = { r1: 1 };
  so.totalNumScheduledTokens = 1;
  so.sampleAfter = { r1: true };
  so.newBlockIdsToZero = [5, 6];
  return so;
}

test('runner: no forward is enqueued on the compute stream before preForward (the step’s READs) returns; the step’s zeroing may run meanwhile', async () => {
  const { d, runner, hooks } = await setup();
  let returned = false;
  const exec = runner.executeModel(prefillStep()).then((h) => {
    returned = true;
    return h;
  });
  await turns();
  assert.deepEqual(hooks.calls, ['preForward 1'], 'the runner is waiting on the loads');
  assert.deepEqual(drain(d), ['zero 1'], 'only the zeroing was on the stream: no forward while READs are outstanding');
  assert.equal(returned, false, 'executeModel does not return before the loads');
  await turns();
  assert.deepEqual(drain(d), [], 'still nothing new on the stream');

  hooks.gate(1).resolve(NO_FAILURES);
  const handle = await exec;
  assert.deepEqual(drain(d), ['forward 1'], 'the forward is enqueued once preForward returned');
  const out = await handle.output;
  assert.deepEqual(
    out.sampled.map((s) => s.requestId),
    ['r1'],
  );
  assert.deepEqual(hooks.calls, ['preForward 1', 'postForward 1']);
  assert.equal(runner.stats.forwards, 1);
  await d.close();
});

test('runner, async scheduling: step 2’s forward waits for step 2’s preForward even with step 1’s forward still queued ahead of step 2’s zeroing', async () => {
  const { d, runner, hooks } = await setup();
  hooks.gate(1).resolve(NO_FAILURES);
  const step1 = await runner.executeModel(prefillStep());
  // Step 1's zeroing and forward are queued, not run (the previous forward "still running"); step 2 is
  // prepared now: its zeroing goes behind step 1's forward, its READs are outstanding.
  const exec2 = runner.executeModel(decodeStep());
  await turns();
  assert.deepEqual(hooks.calls, ['preForward 1', 'preForward 2']);
  assert.deepEqual(drain(d), ['zero 1', 'forward 1', 'zero 2'], 'no forward 2 while step 2 READs are outstanding');
  await step1.output;

  hooks.gate(2).resolve(NO_FAILURES);
  const step2 = await exec2;
  assert.deepEqual(drain(d), ['forward 2']);
  const out = await step2.output;
  assert.deepEqual(
    out.sampled.map((s) => s.requestId),
    ['r1'],
  );
  await d.close();
});
