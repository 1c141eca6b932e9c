/**
 * OneSidedConnector, worker side: moves the bytes the scheduler side decided on. Four roles, each with
 * its own table of transfers and their states (transfer_table.ts):
 *
 *   ReadConsumer   decode, READ: post every READ of the step, await them all before the forward, release
 *   Producer       prefill: pages held for a peer until it releases them (READ) or they were pushed (WRITE)
 *   WriteConsumer  decode, WRITE: grant the producer our pages, wait for write_done or the deadline
 *   WriteProducer  prefill, WRITE: push a finished request's pages once decode said where
 *
 * This class routes the step's metadata and the side channel's notifications to them and implements
 * the runner's hooks (preForward / postForward) and vLLM's get_finished.
 */
import type { Env } from '../util/env.ts';
import type { Logger } from '../util/log.ts';
import { mutationsFor } from '../util/mutants.ts';
import type { Device } from '../device/types.ts';
import type { KVCacheConfig } from '../kv/spec.ts';
import type { TransferEngine } from '../transfer/core/types.ts';
import type { ConnectorWorkerHooks, LoadResult } from '../worker/hooks.ts';
import type { OneSidedMetadata } from '../worker/connector_metadata.ts';
import { emptyConnectorOutput, type KVConnectorOutput, type SchedulerOutput } from '../worker/scheduler_output.ts';
import type { OneSidedConfig } from './config.ts';
import type { PeerDirectory } from './peer_directory.ts';
import { Producer } from './producer.ts';
import { ReadConsumer } from './read_consumer.ts';
import { WorkerContext } from './worker_context.ts';
import { WriteConsumer } from './write_consumer.ts';
import { WriteProducer } from './write_producer.ts';

export class OneSidedConnectorWorker implements ConnectorWorkerHooks {
  private readonly ctx: WorkerContext;
  readonly reads: ReadConsumer;
  readonly producer: Producer;
  readonly recvs: WriteConsumer;
  readonly saves: WriteProducer;
  private readonly unsubscribe: () => void;
  readonly zeroBeforeLoads: boolean;

  constructor(
    readonly config: OneSidedConfig,
    readonly kvConfig: KVCacheConfig,
    transfer: TransferEngine,
    device: Device,
    /** Transfer group → KV group id (attention groups first, then Mamba). */
    transferGroupIds: number[],
    env: Env,
    /** Producers' side channels, handshaken off the step path (the scheduler side waits for them). */
    peers: PeerDirectory,
    private readonly log?: Logger,
    private readonly onActivity?: () => void,
  ) {
    this.ctx = new WorkerContext(
      config,
      kvConfig,
      transfer,
      device,
      transferGroupIds,
      env,
      peers,
      mutationsFor(config.mutant),
      log,
    );
    this.zeroBeforeLoads = this.ctx.mutations.zeroBeforeLoads;
    this.reads = new ReadConsumer(this.ctx, () => this.onActivity?.());
    this.producer = new Producer(this.ctx, () => this.onActivity?.());
    this.recvs = new WriteConsumer(this.ctx, () => this.onActivity?.());
    this.saves = new WriteProducer(this.ctx, () => this.onActivity?.());
    this.unsubscribe = transfer.onNotification((from, n, grantEnded) => {
      if (n.type === 'release' && config.mode === 'read' && !grantEnded) {
        // READ: every held transfer has a live grant until it is released or its lease ends, so a release
        // that ended none is a duplicate, a late or a made-up one. Kept as "released early", it would free
        // the next transfer under this id at once while that transfer's grant is still live.
        this.log?.warn({ from, transferId: n.transferId }, 'release of a transfer with no live grant dropped');
      } else if (n.type === 'release') {
        // A push under way still reads the pages: they are reported when it ends (WriteProducer), never
        // on a release that comes meanwhile (that freed pages the NIC was sending from).
        if (this.saves.released(n.transferId) !== 'pushing') this.producer.released(n.transferId);
      } else if (n.type === 'remote_blocks') {
        const p = n.payload ?? {};
        const skip = p['skipBlocks'] ?? 0;
        const endToken = p['endToken'] ?? null;
        if (
          !Array.isArray(p['blockIds']) ||
          typeof p['grant'] !== 'string' ||
          !Number.isInteger(skip) ||
          (skip as number) < 0 ||
          (endToken !== null && (!Number.isInteger(endToken) || (endToken as number) < 0))
        ) {
          this.log?.warn({ from, transferId: n.transferId }, 'malformed remote_blocks notification dropped');
          return;
        }
        const dest = {
          fromEngineId: from,
          blockIds: p['blockIds'] as number[][],
          skipBlocks: skip as number,
          endToken: endToken as number | null,
          grant: p['grant'],
        };
        this.saves.destination(n.transferId, dest);
      } else if (n.type === 'write_done') this.recvs.writeDone(n.transferId, n.payload?.['grant']);
      // Only with its grant's token (it ended the live grant): a peer cannot fail another's load.
      else if (n.type === 'write_refused' && grantEnded) this.recvs.writeRefused(n.transferId);
      this.onActivity?.();
    });
  }

  /** Counters for /metrics and the A/B (plain numbers). */
  get stats(): {
    readsPosted: number;
    readsAsync: number;
    readsFailed: number;
    releasesSent: number;
    releasesFailed: number;
    writesPosted: number;
    hostSyncWaits: number;
    /** Pages whose clipped tail was zeroed after their load (READ or WRITE) landed. */
    tailsZeroed: number;
  } {
    return {
      ...this.reads.stats,
      writesPosted: this.saves.stats.writesPosted,
      tailsZeroed: this.reads.stats.tailsZeroed + this.recvs.stats.tailsZeroed,
    };
  }

  /** The runner's hook before the forward: bind this step's metadata, post its READs, await every one. */
  async preForward(so: SchedulerOutput): Promise<LoadResult> {
    const meta = so.kvConnectorMetadata;
    if (!meta) return { failedReqIds: [], invalidBlockIds: [], loadErrors: {} };
    this.bindConnectorMetadata(meta);
    await this.reads.startLoadKv(meta.reqsToRecv, so.step);
    // Mutant no-await-reads: the forward is enqueued while the NIC may still be writing its pages.
    if (!this.ctx.mutations.awaitReadsBeforeForward) return this.reads.leaveReadsInFlight(so.step);
    return this.reads.awaitReadsIssuedThisStep(so.step);
  }

  /** Producer bookkeeping, grants to revoke, WRITE saves and WRITE destination notices of this step. */
  private bindConnectorMetadata(meta: OneSidedMetadata): void {
    // WRITE: a release that came before its transfer was held must not free pages a decode named a
    // destination for: their push starts in this step (write_early_release.test.ts).
    this.producer.bind(meta.sendTransfers, (transferId) => this.saves.hasDestination(transferId));
    // A save whose transfer an early release just ended (no destination yet) is not kept: its pages are
    // reported free, so a destination that comes later must not push from them (write_late_destination.test.ts).
    for (const s of meta.reqsToSave) if (this.producer.isHeld(s.transferId)) this.saves.save(s);
    if (this.ctx.config.mode === 'write') this.saves.expire(meta.expiring);
    else this.producer.expire(meta.expiring);
    this.saves.prune(meta.sendTransfers);
    for (const a of meta.abortedRecvs)
      if (this.ctx.config.mode === 'read') this.reads.aborted(a.requestId);
      else this.recvs.aborted(a.transferId, a.requestId);
    for (const n of meta.reqsToNotify) this.recvs.notifyRemoteBlocks(n);
    this.saves.startReadySaves();
  }

  /**
   * The runner's hook after the forward, with vLLM's get_finished: requests whose pages may now be freed
   * on this side (producer: released by the peer or pushed; consumer: aborted loads no WRITE can reach),
   * WRITE loads that completed, and WRITE loads that failed.
   */
  async postForward(so: SchedulerOutput): Promise<KVConnectorOutput> {
    await this.reads.settleLateReads(so.step);
    this.saves.startReadySaves();
    const recv = this.recvs.collect(so.step);
    const reads = this.reads.collectAsync(so.step);
    // With async scheduling the tails' zeroing sits behind the next step's forward, past what the free
    // fence covers (it waits for steps): the pages could be freed at this step's update and handed to
    // another WRITE that lands before the zeroing. Report the loads once it has run.
    if (recv.tailsZeroed !== null) await recv.tailsZeroed;
    if (reads.tailsZeroed !== null) await reads.tailsZeroed;
    const finishedSending = [
      ...this.producer.takeFinished(),
      ...this.saves.takeFinished(),
      ...recv.releasedAborted,
      ...reads.releasedAborted,
    ];
    return {
      ...emptyConnectorOutput(),
      finishedSending,
      finishedRecving: [...recv.finishedRecving, ...reads.finishedRecving],
      failedLoadReqIds: [...recv.loads.failedLoadReqIds, ...reads.loads.failedReqIds],
      invalidBlockIds: [...recv.loads.invalidBlockIds, ...reads.loads.invalidBlockIds],
      loadErrors: { ...recv.loads.loadErrors, ...reads.loads.loadErrors },
    };
  }

  /** READ latencies since the last call (ms). */
  drainReadLatencies(): number[] {
    return this.reads.drainReadLatencies();
  }

  hasPendingWork(): boolean {
    return this.saves.numPending > 0 || this.recvs.size > 0 || this.reads.hasAsync;
  }

  abandonLoads(): void {
    this.reads.abandon();
  }

  close(): void {
    this.unsubscribe();
  }
}
