/**
 * One serving instance inside the simulated world: an LLMEngine (the real scheduler, runner, model
 * and OneSidedConnector) on a sim device whose ops run only when the explorer says so, a `sim`
 * transfer engine on the world's fabric, and the instrumentation the oracles need: every op enqueued
 * on the compute stream and every page taken from or returned to the pool is reported (observed,
 * never changed). Built by buildInstance, the composition root the servers use, with the sim device
 * and a sim transfer engine injected.
 */
import { assert } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import type { SimDevice } from '../device/sim.ts';
import type { OpSubmission, PageAccess } from '../device/types.ts';
import { watchPool, watchRollbacks, watchStream } from '../kv/lifecycle_watch.ts';
import type { ModelPreset } from '../kv/presets.ts';
import { kvEventEpoch } from '../kv/kv_events.ts';
import { attentionSlabs, type KVCacheConfig } from '../kv/spec.ts';
import type { SimFabric } from '../transfer/sim/sim_fabric.ts';
import { SimTransferEngine } from '../transfer/sim/sim.ts';
import type { OneSidedConfig } from '../connector/config.ts';
import { buildInstance } from '../engine/build_instance.ts';
import { simDevice } from '../engine/devices.ts';
import type { LLMEngine } from '../engine/llm_engine.ts';
import type { SchedulerConfig } from '../engine/scheduler_config.ts';
import { PageLifecycle, type LifecycleViolation } from '../kv/page_lifecycle.ts';

export interface InstanceSpec {
  /** 'P' (prefill) or 'D' (decode): the prefix of every choice key and trace lane. */
  name: string;
  role: 'producer' | 'consumer';
  preset: ModelPreset;
  modelSeed: number;
  numBlocks: number;
  blockSize: number;
  tensorParallelSize: number;
  scheduler: Partial<SchedulerConfig>;
  connector: OneSidedConfig;
  idlePollMs: number;
  notifyTimeoutMs: number;
}

/** What the world learns about each op enqueued on an instance's compute stream. */
export interface OpInfo {
  kind: 'zero' | 'zero-spans' | 'copy' | 'sleep' | 'kernel';
  what: string;
  step: number | null;
  requestIds: string[];
  /** Forward: tokens computed; zero/copy: pages. */
  tokens: number;
  pages: number;
  /** Blocks the op reads and writes (any slab, any bytes): the dpor footprint and the coverage line. */
  readBlocks: number[];
  writeBlocks: number[];
}

export interface InstanceObserver {
  opEnqueued(inst: SimInstance, opId: number, info: OpInfo): void;
}

export class SimInstance {
  engine!: LLMEngine;
  device!: SimDevice;
  transfer!: SimTransferEngine;
  lifecycle!: PageLifecycle;
  kvConfig!: KVCacheConfig;
  readonly ops = new Map<number, OpInfo>();
  alive = true;
  readonly engineId: string;

  private constructor(
    readonly spec: InstanceSpec,
    private readonly observer: InstanceObserver,
  ) {
    this.engineId = `sim-${spec.name}`;
  }

  get name(): string {
    return this.spec.name;
  }

  static async create(
    spec: InstanceSpec,
    env: Env,
    fabric: SimFabric,
    observer: InstanceObserver,
    onViolation: (v: LifecycleViolation) => void,
  ): Promise<SimInstance> {
    const inst = new SimInstance(spec, observer);
    const makeDevice = simDevice(spec.preset, spec.modelSeed, { raceCheck: true, autoRun: false });
    const built = await buildInstance(
      {
        preset: spec.preset,
        modelSeed: spec.modelSeed,
        numBlocks: spec.numBlocks,
        blockSize: spec.blockSize,
        tensorParallelSize: spec.tensorParallelSize,
        asyncScheduling: true,
        scheduler: spec.scheduler,
        idlePollMs: spec.idlePollMs,
        kvEventsEpoch: kvEventEpoch(env.wallMs(), inst.engineId),
        // The oracles watch the stream from its first op: instrument the device before anything uses it.
        makeDevice: async (kv) => {
          const device = await makeDevice(kv);
          inst.device = device;
          inst.kvConfig = kv;
          inst.lifecycle = new PageLifecycle(
            spec.name,
            kv.numBlocks,
            kv.pageBytes,
            kv.needsKvCacheZeroing,
            attentionSlabs(kv),
            onViolation,
          );
          inst.watchStream();
          return device;
        },
        connector: {
          config: { ...spec.connector, role: spec.role },
          endpoint: { backend: 'sim', engineId: inst.engineId, modelName: spec.preset, preset: spec.preset },
          // The world's fabric, where the explorer decides when each NIC work request completes.
          createTransfer: async ({ backend: _backend, ...o }) =>
            new SimTransferEngine({
              ...o,
              fabric,
              notifyTimeoutMs: spec.notifyTimeoutMs,
              handshakeTimeoutMs: spec.notifyTimeoutMs,
            }),
          allowedPeers: ['*'],
        },
      },
      env,
    );
    inst.engine = built.engine;
    // The world's crash oracle reports an engine-loop crash (a replay runs on after the first violation).
    inst.engine.core.reportCrashesViaCrashed();
    const transfer = built.connector?.transfer;
    assert(transfer instanceof SimTransferEngine, 'a sim instance runs on a sim transfer engine');
    inst.transfer = transfer;
    inst.watchPool();
    return inst;
  }

  /** Report every op enqueued on the compute stream (zero, forward, copy) to the lifecycle and the world. */
  private watchStream(): void {
    watchStream(this.lifecycle, this.device.compute, this.kvConfig.pageBytes);
    this.device.compute.observe({
      enqueued: (sub: OpSubmission, opId: number) => {
        const op = sub.op;
        const info: OpInfo = {
          kind: op.kind,
          what: sub.label.what,
          step: sub.label.step ?? null,
          requestIds: sub.label.requestIds ?? [],
          tokens: op.kind === 'kernel' ? forwardTokens(op.args) : 0,
          pages: pagesOf(op),
          ...blocksOf(op, sub.footprint ?? []),
        };
        this.ops.set(opId, info);
        this.observer.opEnqueued(this, opId, info);
      },
      executed: (opId: number) => {
        this.ops.delete(opId);
      },
    });
  }

  /** Report pages leaving the free pool (fresh, or revived by a prefix hit) and coming back, and rolled-back loads. */
  private watchPool(): void {
    watchPool(this.lifecycle, this.engine.kv.blockPool);
    watchRollbacks(this.lifecycle, this.engine.kv);
  }

  /** Execute ready op `opId` (rank `rank`'s part of it, with tensor parallel ranks); observers tell the lifecycle. */
  runOp(opId: number, rank: number | null = null): void {
    this.device.runOp(opId, rank);
  }

  /** Stop serving without a goodbye (peer death): the NIC fails everything queued to or from it. */
  kill(): void {
    this.alive = false;
    void this.transfer.close();
  }

  async close(): Promise<void> {
    if (!this.alive) return;
    await this.engine.close();
  }
}

function blocksOf(op: OpSubmission['op'], declared: readonly PageAccess[]): Pick<OpInfo, 'readBlocks' | 'writeBlocks'> {
  const read = new Set<number>(declared.filter((a) => !a.write).map((a) => a.block));
  const write = new Set<number>(declared.filter((a) => a.write).map((a) => a.block));
  if (op.kind === 'zero') for (const b of op.blockIds) write.add(b);
  if (op.kind === 'zero-spans') for (const s of op.spans) write.add(s.block);
  if (op.kind === 'copy') for (const [src, dst] of op.pairs) (read.add(src), write.add(dst));
  return { readBlocks: [...read].sort((a, b) => a - b), writeBlocks: [...write].sort((a, b) => a - b) };
}

/** Pages a zero, zero-spans or copy op touches (its cost); 0 for the others. */
function pagesOf(op: OpSubmission['op']): number {
  if (op.kind === 'zero') return op.blockIds.length;
  if (op.kind === 'zero-spans') return new Set(op.spans.map((s) => s.block)).size;
  return op.kind === 'copy' ? op.pairs.length : 0;
}

function forwardTokens(args: unknown): number {
  const reqs = (args as { requests?: Array<{ tokenIds: unknown[] }> } | null)?.requests ?? [];
  return reqs.reduce((n, r) => n + r.tokenIds.length, 0);
}
