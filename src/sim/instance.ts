/**
 * One serving instance inside the simulated world: an LLMEngine (the real scheduler, runner, model
 * and OneSidedConnector) on a sim device whose ops run only when the explorer says so, a `sim`
 * transfer engine on the world's fabric, and the instrumentation the oracles need: every op enqueued
 * on the compute stream and every page taken from or returned to the pool is reported (observed,
 * never changed).
 *
 * The connector is assembled like connector/factory.ts does, because that factory requires
 * SharedArrayBuffer slabs (a threaded device) and the sim device's slabs are plain memory.
 */
import type { Env } from '../util/env.ts';
import type { SimDevice } from '../device/sim.ts';
import type { OpSubmission } from '../device/types.ts';
import type { KVCacheBlock } from '../kv/block_pool.ts';
import type { ModelPreset } from '../kv/presets.ts';
import { attentionSlabs, type KVCacheConfig } from '../kv/spec.ts';
import type { SimFabric } from '../transfer/sim/sim_fabric.ts';
import { SimTransferEngine } from '../transfer/sim/sim.ts';
import type { OneSidedConfig } from '../connector/config.ts';
import { OneSidedConnectorScheduler } from '../connector/one_sided_scheduler.ts';
import { PeerDirectory } from '../connector/peer_directory.ts';
import { OneSidedConnectorWorker } from '../connector/one_sided_worker.ts';
import { simDevice } from '../engine/devices.ts';
import { LLMEngine, type ConnectorPair } from '../engine/llm_engine.ts';
import type { SchedulerConfig } from '../engine/scheduler_config.ts';
import { PageLifecycle, type LifecycleViolation } from './page_lifecycle.ts';

export interface InstanceSpec {
  /** 'P' (prefill) or 'D' (decode): the prefix of every choice key and trace lane. */
  name: string;
  role: 'producer' | 'consumer';
  preset: ModelPreset;
  modelSeed: number;
  numBlocks: number;
  scheduler: Partial<SchedulerConfig>;
  connector: OneSidedConfig;
  idlePollMs: number;
  notifyTimeoutMs: number;
}

/** What the world learns about each op enqueued on an instance's compute stream. */
export interface OpInfo {
  kind: 'zero' | 'copy' | 'sleep' | 'kernel';
  what: string;
  step: number | null;
  requestIds: string[];
  /** Forward: tokens computed; zero/copy: pages. */
  tokens: number;
  pages: number;
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

  static async create(spec: InstanceSpec, env: Env, fabric: SimFabric, observer: InstanceObserver, onViolation: (v: LifecycleViolation) => void): Promise<SimInstance> {
    const inst = new SimInstance(spec, observer);
    const makeDevice = simDevice(spec.preset, spec.modelSeed, { raceCheck: true, autoRun: false });
    inst.engine = await LLMEngine.create(
      {
        preset: spec.preset,
        modelSeed: spec.modelSeed,
        numBlocks: spec.numBlocks,
        asyncScheduling: true,
        scheduler: spec.scheduler,
        idlePollMs: spec.idlePollMs,
        makeDevice: async (kv) => {
          inst.kvConfig = kv;
          inst.device = await makeDevice(kv);
          inst.lifecycle = new PageLifecycle(spec.name, kv.numBlocks, kv.pageBytes, kv.needsKvCacheZeroing, attentionSlabs(kv), onViolation);
          inst.watchStream();
          return inst.device;
        },
        makeConnector: async (ctx) => inst.makeConnector(ctx.kvConfig, ctx.env, ctx.numLookaheadTokens, fabric),
      },
      env,
    );
    inst.watchPool();
    return inst;
  }

  private makeConnector(kvConfig: KVCacheConfig, env: Env, numLookaheadTokens: number, fabric: SimFabric): ConnectorPair {
    const { spec } = this;
    this.transfer = new SimTransferEngine({
      env,
      fabric,
      engineId: this.engineId,
      modelName: spec.preset,
      preset: spec.preset,
      layout: { numSlabs: kvConfig.numSlabs, numBlocks: kvConfig.numBlocks, pageBytes: kvConfig.pageBytes },
      blockSizes: kvConfig.groups.map((g) => g.spec.blockSize),
      cacheHash: JSON.stringify(kvConfig.groups.map((g) => g.spec)),
      slabViews: this.device.slabs,
      notifyTimeoutMs: spec.notifyTimeoutMs,
      handshakeTimeoutMs: spec.notifyTimeoutMs,
    });
    this.transfer.attachRaceChecker(this.device.raceChecker);
    const addr = this.transfer.address();
    const config = { ...spec.connector, role: spec.role };
    const transfer = this.transfer;
    const kick = (): void => this.engine?.core.kick();
    const peers = new PeerDirectory((p) => transfer.handshake(p), env, ['*'], kick);
    const endpoint = { engineId: this.engineId, host: addr.host, port: addr.port };
    const scheduler = new OneSidedConnectorScheduler(config, kvConfig, env, endpoint, transfer, numLookaheadTokens, peers);
    const worker = new OneSidedConnectorWorker(config, kvConfig, transfer, this.device, scheduler.transferGroupIds, env, peers, undefined, kick);
    return {
      scheduler,
      worker,
      close: async () => {
        worker.close();
        await this.transfer.close();
      },
    };
  }

  /** Report every op enqueued on the compute stream (zero, forward, copy) before it is queued. */
  private watchStream(): void {
    const stream = this.device.compute;
    const enqueue = stream.enqueue.bind(stream);
    stream.enqueue = (sub: OpSubmission) => {
      const ticket = enqueue(sub);
      const op = sub.op;
      const info: OpInfo = {
        kind: op.kind,
        what: sub.label.what,
        step: sub.label.step ?? null,
        requestIds: sub.label.requestIds ?? [],
        tokens: op.kind === 'kernel' ? forwardTokens(op.args) : 0,
        pages: op.kind === 'zero' ? op.blockIds.length : op.kind === 'copy' ? op.pairs.length : 0,
      };
      this.ops.set(ticket.id, info);
      if (op.kind === 'zero') this.lifecycle.zeroEnqueued(ticket.id, op.blockIds, op.slabs);
      if (op.kind === 'kernel') this.lifecycle.forwardEnqueued(ticket.id, sub.footprint ?? []);
      if (op.kind === 'copy') this.lifecycle.forwardEnqueued(ticket.id, op.pairs.flatMap(([src, dst]) => [
        { slab: 0, block: src, start: 0, end: this.kvConfig.pageBytes, write: false },
        { slab: 0, block: dst, start: 0, end: this.kvConfig.pageBytes, write: true },
      ]));
      this.observer.opEnqueued(this, ticket.id, info);
      return ticket;
    };
  }

  /** Report pages leaving the free pool (fresh, or revived by a prefix hit) and coming back. */
  private watchPool(): void {
    const pool = this.engine.kv.blockPool;
    const getNew = pool.getNewBlocks.bind(pool);
    const touch = pool.touch.bind(pool);
    const free = pool.freeBlocks.bind(pool);
    pool.getNewBlocks = (n: number) => {
      const out = getNew(n);
      this.lifecycle.allocated(out.map((b) => b.blockId), true);
      return out;
    };
    pool.touch = (blocks: Iterable<KVCacheBlock>) => {
      const list = [...blocks];
      const revived = list.filter((b) => b.refCnt === 0).map((b) => b.blockId);
      touch(list);
      this.lifecycle.allocated(revived, false);
    };
    pool.freeBlocks = (blocks: Iterable<KVCacheBlock>) => {
      const list = [...blocks];
      free(list);
      this.lifecycle.freed(list.filter((b) => b.refCnt === 0).map((b) => b.blockId));
    };
  }

  /** Execute ready op `opId` and tell the lifecycle. */
  runOp(opId: number): void {
    const info = this.ops.get(opId);
    this.device.runOp(opId);
    if (info?.kind === 'zero') this.lifecycle.zeroRan(opId);
    if (info?.kind === 'kernel' || info?.kind === 'copy') this.lifecycle.forwardRan(opId);
    this.ops.delete(opId);
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

function forwardTokens(args: unknown): number {
  const reqs = (args as { requests?: Array<{ tokenIds: unknown[] }> } | null)?.requests ?? [];
  return reqs.reduce((n, r) => n + r.tokenIds.length, 0);
}
