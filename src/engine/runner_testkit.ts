/** Test kit: a scheduler + real runner over an in-process sim device, stepped by hand. */
import { RealEnv } from '../util/env.ts';
import { KVCacheManager } from '../kv/kv_cache_manager.ts';
import type { ModelPreset } from '../kv/presets.ts';
import { NullConnector } from '../connector/base.ts';
import { ModelRunner, type StepHandle } from '../worker/model_runner.ts';
import type { SchedulerOutput } from '../worker/scheduler_output.ts';
import type { EngineOutput } from './output.ts';
import { kvCacheConfigOf, schedulerConfigOf } from './llm_engine.ts';
import { Request } from './request.ts';
import { Scheduler, type SchedulerConfig } from './scheduler.ts';
import { simDevice } from './devices.ts';

export async function makeHarness(
  preset: ModelPreset,
  numBlocks: number,
  sched: Partial<SchedulerConfig>,
  blockSize = 16,
) {
  const env = new RealEnv(3);
  const cfg = { preset, modelSeed: 1, numBlocks, blockSize, asyncScheduling: true, scheduler: sched, idlePollMs: 1 };
  const kvConfig = kvCacheConfigOf(cfg);
  const device = await simDevice(preset, 1)(kvConfig);
  const schedCfg = schedulerConfigOf(cfg);
  const kv = new KVCacheManager(kvConfig, { enableCaching: schedCfg.enablePrefixCaching });
  const scheduler = new Scheduler(schedCfg, kv, new NullConnector(), env);
  const runner = new ModelRunner(device, kvConfig, null, 0);
  const tokens = new Map<string, number[]>();
  const finished = new Map<string, string>();
  const hashes = new Map<string, string[]>();
  const queue: Array<{ so: SchedulerOutput; h: StepHandle }> = [];
  const take = (outs: EngineOutput[]) => {
    for (const o of outs) {
      tokens.set(o.requestId, [...(tokens.get(o.requestId) ?? []), ...o.newTokenIds]);
      hashes.set(o.requestId, [...(hashes.get(o.requestId) ?? []), ...o.logitsHashes.map(String)]);
      if (o.finishReason) finished.set(o.requestId, o.finishReason);
    }
  };
  const h = {
    env,
    kv,
    scheduler,
    runner,
    tokens,
    hashes,
    finished,
    add(
      id: string,
      prompt: number[],
      maxTokens: number,
      extra: { stopTokenIds?: number[]; temperature?: number } = {},
    ) {
      scheduler.addRequest(
        new Request({
          requestId: id,
          promptTokenIds: prompt,
          sampling: { maxTokens, temperature: 0, seed: 0, stopTokenIds: [], ignoreEos: true, ...extra },
          arrivalMs: 0,
        }),
      );
    },
    abort(id: string) {
      scheduler.abortRequest(id);
      take(scheduler.drainPendingOutputs());
    },
    /** Schedule one step and hand it to the runner (not yet processed). */
    async launch(): Promise<SchedulerOutput> {
      const so = scheduler.schedule();
      queue.push({ so, h: await runner.executeModel(so) });
      return so;
    },
    /** Process the oldest launched step. */
    async land(): Promise<void> {
      const head = queue.shift();
      if (!head) return;
      take(scheduler.updateFromOutput(head.so, await head.h.output));
    },
    async step(): Promise<SchedulerOutput> {
      const so = await h.launch();
      await h.land();
      return so;
    },
    async drain(depth = 1, maxSteps = 500): Promise<void> {
      for (let i = 0; i < maxSteps && (scheduler.hasWork() || queue.length > 0); i++) {
        while (queue.length < depth && scheduler.hasWork()) await h.launch();
        await h.land();
      }
    },
    get inFlight() {
      return queue.length;
    },
  };
  return h;
}

export async function runAlone(
  preset: ModelPreset,
  prompt: number[],
  maxTokens: number,
  sched: Partial<SchedulerConfig> = {},
  extra: { stopTokenIds?: number[]; temperature?: number } = {},
  blockSize = 16,
) {
  const h = await makeHarness(preset, Math.ceil((96 * 16) / blockSize), sched, blockSize);
  h.add('alone', prompt, maxTokens, extra);
  await h.drain();
  return { tokens: h.tokens.get('alone') ?? [], hashes: h.hashes.get('alone') ?? [] };
}
