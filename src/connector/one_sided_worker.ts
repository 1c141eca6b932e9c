/**
 * OneSidedConnector, worker side: moves the bytes the scheduler side decided on.
 *
 * READ consumer, per step (preForward): handshake new peers, post every READ of the step from the host
 * (the NIC writes straight into the slabs, not ordered with the compute stream), then await EVERY READ
 * before returning, so the step's forward is enqueued only after all its KV has landed. Each finished
 * READ sends `release` so the producer frees its pages. `syncBeforeRead` (the alternative fix) makes
 * the host wait for the compute stream before posting.
 * READ producer: `release` notifications → finishedSending (via the transfer id → request map).
 * WRITE: the consumer grants its destination pages and notifies the producer (`remote_blocks`); the
 * producer pushes once its pages are final and notifies `write_done` after the destination acknowledged.
 */
import { assert, rethrowIfAssertion } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import { HandoffError, isHandoffError } from '../util/errors.ts';
import type { Logger } from '../util/log.ts';
import type { Device, PageAccess } from '../device/types.ts';
import { slabTransferRanges } from '../kv/layout.ts';
import type { KVCacheConfig } from '../kv/spec.ts';
import type { TransferEngine, TransferHandle, TransferRange } from '../transfer/core/types.ts';
import type { ConnectorWorkerHooks, LoadResult } from '../worker/hooks.ts';
import { emptyConnectorOutput, type KVConnectorOutput, type SchedulerOutput } from '../worker/scheduler_output.ts';
import { alignReadBlocks } from './alignment.ts';
import type { OneSidedConfig } from './config.ts';
import type { NotifyReqMeta, OneSidedMetadata, RecvReqMeta, SaveReqMeta } from './metadata.ts';
import type { PeerDirectory } from './peer_directory.ts';

interface RemoteBlocks {
  fromEngineId: string;
  blockIds: number[][];
  skipBlocks: number;
  grant: string;
}

export class OneSidedConnectorWorker implements ConnectorWorkerHooks {
  private sendTransfers: Record<string, string> = {};
  private readonly released = new Set<string>();
  private readonly pendingSaves = new Map<string, SaveReqMeta>();
  private readonly remoteBlocks = new Map<string, RemoteBlocks>();
  private readonly savesInFlight = new Set<string>();
  private finishedSaves: string[] = [];
  /** WRITE consumer: transfer id → request and the time by which the producer must have written. */
  private readonly recvTransfers = new Map<string, { requestId: string; deadlineMs: number; blockIds: number[]; aborted: boolean }>();
  /** WRITE consumer: aborted requests whose pages no WRITE can reach any more (→ finishedSending). */
  private releasedAborted: string[] = [];
  private finishedRecving: string[] = [];
  private readsIssuedThisStep: Array<{ r: RecvReqMeta; handle: TransferHandle | null; error: HandoffError | null }> = [];
  private readsPostedAtMs = 0;
  /** Mutant 'no-await-reads' only: READs observed after the forward. */
  private lateReads: Array<{ r: RecvReqMeta; handle: TransferHandle }> = [];
  private readonly unsubscribe: () => void;
  stats = { readsPosted: 0, readsFailed: 0, releasesSent: 0, releasesFailed: 0, writesPosted: 0, hostSyncWaits: 0 };
  /** Latency of each request's READs (post → landed, ms), drained by the metrics; bounded. */
  private readLatenciesMs: number[] = [];

  constructor(
    readonly config: OneSidedConfig,
    readonly kvConfig: KVCacheConfig,
    private readonly transfer: TransferEngine,
    private readonly device: Device,
    /** Transfer group → KV group id (attention groups first, then Mamba). */
    private readonly transferGroupIds: number[],
    private readonly env: Env,
    /** Producers' side channels, handshaken off the step path (the scheduler side waits for them). */
    private readonly peers: PeerDirectory,
    private readonly log?: Logger,
    private readonly onActivity?: () => void,
  ) {
    this.unsubscribe = transfer.onNotification((from, n) => {
      if (n.type === 'release') {
        this.released.add(n.transferId);
        transfer.revokeGrant(n.transferId); // a grant dies on release
      } else if (n.type === 'remote_blocks') {
        const p = n.payload ?? {};
        const skip = p['skipBlocks'] ?? 0;
        if (!Array.isArray(p['blockIds']) || typeof p['grant'] !== 'string' || !Number.isInteger(skip) || (skip as number) < 0) {
          this.log?.warn({ from, transferId: n.transferId }, 'malformed remote_blocks notification dropped');
          return;
        }
        this.remoteBlocks.set(n.transferId, { fromEngineId: from, blockIds: p['blockIds'] as number[][], skipBlocks: skip as number, grant: p['grant'] });
      } else if (n.type === 'write_done') {
        const rec = this.recvTransfers.get(n.transferId);
        if (rec !== undefined) {
          this.recvTransfers.delete(n.transferId);
          transfer.revokeGrant(n.transferId);
          if (rec.aborted) this.releasedAborted.push(rec.requestId);
          else this.finishedRecving.push(rec.requestId);
        }
      }
      this.onActivity?.();
    });
  }

  /** Transfer groups before the first Mamba group. */
  private get numAttnGroups(): number {
    const n = this.transferGroupIds.findIndex((g) => this.kvConfig.groups[g]?.spec.type === 'mamba');
    return n < 0 ? this.transferGroupIds.length : n;
  }

  /** Slabs holding a transfer group's layers. */
  private slabsOf(transferGroup: number): number[] {
    const g = this.kvConfig.groups[this.transferGroupIds[transferGroup] ?? -1];
    assert(g !== undefined, `transfer group ${transferGroup} has no KV group`);
    return g.layerNames.map((_, i) => i);
  }

  private rangesFor(local: number[][], remote: number[][]): { ranges: TransferRange[]; footprint: PageAccess[] } {
    const ranges: TransferRange[] = [];
    const footprint: PageAccess[] = [];
    local.forEach((ids, tg) => {
      if (ids.length === 0) return;
      const slabs = this.slabsOf(tg);
      ranges.push(...slabTransferRanges(this.kvConfig, slabs, ids, remote[tg] ?? []));
      for (const slab of slabs) for (const block of ids) footprint.push({ slab, block, start: 0, end: this.kvConfig.pageBytes, write: true });
    });
    return { ranges, footprint };
  }

  /**
   * The engine at host:port, as the directory knows it now. Never handshakes and never waits: the
   * scheduler side admitted the request only once the handshake settled.
   */
  private readyPeer(host: string, port: number, expected: string): string {
    const st = this.peers.peek(host, port);
    if (st?.state === 'failed') {
      // An engine this instance never reached, at an address that does not answer: the params are wrong.
      if (this.peers.knows(expected)) throw st.error;
      const why = `remote_engine_id ${expected} is unknown here and ${host}:${port} does not answer (${st.error.message})`;
      throw new HandoffError('BAD_TRANSFER_PARAMS', why, { param: 'kv_transfer_params.remote_host' });
    }
    if (st?.state !== 'ready') throw new HandoffError('PEER_UNAVAILABLE', `no side channel to ${host}:${port} yet`);
    if (st.engineId !== expected) throw new HandoffError('BAD_TRANSFER_PARAMS', `peer at ${host}:${port} is ${st.engineId}, not ${expected}`);
    return st.engineId;
  }

  /** The runner's hook before the forward: bind this step's metadata, post its READs, await every one. */
  async preForward(so: SchedulerOutput): Promise<LoadResult> {
    const meta = so.kvConnectorMetadata as OneSidedMetadata | null;
    if (!meta) return { failedReqIds: [], invalidBlockIds: [], loadErrors: {} };
    this.bindConnectorMetadata(meta);
    await this.startLoadKv(meta, so.step);
    if (this.config.mutant === 'no-await-reads') {
      // Mutant: the forward is enqueued while the NIC may still be writing its pages.
      this.lateReads.push(...this.readsIssuedThisStep.flatMap((p) => (p.handle ? [{ r: p.r, handle: p.handle }] : [])));
      this.readsIssuedThisStep = [];
      return { failedReqIds: [], invalidBlockIds: [], loadErrors: {} };
    }
    return this.awaitReadsIssuedThisStep();
  }

  /** Producer bookkeeping, grants to revoke, WRITE saves and WRITE destination notices of this step. */
  private bindConnectorMetadata(meta: OneSidedMetadata): void {
    this.sendTransfers = meta.sendTransfers;
    for (const t of meta.expiredTransfers) this.transfer.revokeGrant(t);
    for (const s of meta.reqsToSave) this.pendingSaves.set(s.transferId, s);
    for (const a of meta.abortedRecvs) {
      // No new WRITE is accepted into these pages; they are released when write_done arrives or the deadline passes.
      this.transfer.revokeGrant(a.transferId);
      const rec = this.recvTransfers.get(a.transferId);
      if (rec) rec.aborted = true;
      else this.releasedAborted.push(a.requestId); // never told the producer where to write
    }
    for (const n of meta.reqsToNotify) this.notifyRemoteBlocks(n);
    this.startReadySaves();
  }

  /** Post this step's READs from the host (the NIC writes the pages without waiting for the stream). */
  async startLoadKv(meta: OneSidedMetadata, step: number): Promise<void> {
    if (meta.reqsToRecv.length === 0) return;
    if (this.config.syncBeforeRead && meta.reqsToRecv.some((r) => r.localBlockIds.some((g) => g.length > 0))) {
      // The alternative fix: the host waits until the stream has run everything queued so far (the
      // previous forward and this step's zeroing) before any READ is posted.
      this.stats.hostSyncWaits++;
      await this.device.compute.recordEvent().wait();
    }
    this.readsPostedAtMs = this.env.nowMs();
    for (const r of meta.reqsToRecv) this.readsIssuedThisStep.push(await this.postReadFor(r, step));
  }

  /**
   * Await every READ issued this step (vLLM #60808: unconditional), with one deadline for the step. A
   * failed or timed-out READ is aborted (the NIC will not touch the pages again) and reported; every
   * READ, failed or not, releases the producer's pages.
   */
  async awaitReadsIssuedThisStep(): Promise<LoadResult> {
    const result: LoadResult = { failedReqIds: [], invalidBlockIds: [], loadErrors: {} };
    const posted = this.readsIssuedThisStep;
    this.readsIssuedThisStep = [];
    const deadlineMs = this.env.nowMs() + this.config.transferTimeoutMs;
    for (const p of posted) {
      let error = p.error;
      if (p.handle && !error) {
        try {
          await this.transfer.wait([p.handle], Math.max(0, deadlineMs - this.env.nowMs()));
          if (this.readLatenciesMs.length < 4096) this.readLatenciesMs.push(this.env.nowMs() - this.readsPostedAtMs);
        } catch (e) {
          if (!isHandoffError(e)) throw e;
          error = e;
          await this.transfer.abort([p.handle]); // the NIC must not touch the pages any more
        }
      }
      if (error) {
        this.stats.readsFailed++;
        // The side channel to that peer is gone: handshake again (for the release below and the next READ).
        if (error.code === 'PEER_UNAVAILABLE') this.peers.forget(p.r.remoteHost, p.r.remotePort);
        this.log?.warn({ requestId: p.r.requestId, code: error.code, err: error.message }, 'KV READ failed');
        result.failedReqIds.push(p.r.requestId);
        result.invalidBlockIds.push(...p.r.localBlockIds.flat());
        result.loadErrors[p.r.requestId] = { code: error.code, message: error.message };
      }
      this.release(p.r);
    }
    return result;
  }

  private async postReadFor(r: RecvReqMeta, step: number): Promise<{ r: RecvReqMeta; handle: TransferHandle | null; error: HandoffError | null }> {
    if (r.localBlockIds.every((g) => g.length === 0)) return { r, handle: null, error: null };
    try {
      const peerEngineId = this.readyPeer(r.remoteHost, r.remotePort, r.remoteEngineId);
      const { ranges, footprint } = this.rangesFor(r.localBlockIds, r.remoteBlockIds);
      this.stats.readsPosted++;
      const handle = this.transfer.postRead({
        peerEngineId,
        transferId: r.transferId,
        grantToken: r.grant,
        ranges,
        label: { what: 'kv-read', requestIds: [r.requestId], step },
        footprint,
      });
      return { r, handle, error: null };
    } catch (e) {
      if (!isHandoffError(e)) throw e;
      return { r, handle: null, error: e };
    }
  }

  /** Tell the producer it may free its pages (also after a failure or an empty READ). */
  private release(r: RecvReqMeta): void {
    // Off the step path: a refused request's release may be the first contact with that producer.
    this.peers
      .resolve(r.remoteHost, r.remotePort, r.remoteEngineId)
      .then((engineId) => this.transfer.notify(engineId, { type: 'release', transferId: r.transferId, payload: { grant: r.grant } }))
      .then(
        () => void this.stats.releasesSent++,
        (e: unknown) => {
          if (!isHandoffError(e)) throw e;
          this.stats.releasesFailed++;
          // The side channel may be gone or stuck: the next use of this peer handshakes again.
          if (e.code !== 'PEER_NOT_ALLOWED' && e.code !== 'BAD_TRANSFER_PARAMS') this.peers.forget(r.remoteHost, r.remotePort);
          this.log?.warn({ transferId: r.transferId, err: e.message }, 'release notification failed; the producer lease will free the pages');
        },
      );
  }

  /**
   * WRITE consumer: grant the producer this request's pages and tell it where to write, without
   * blocking the step. The load's deadline starts now; a producer without a ready side channel fails
   * the load at the next postForward (the request recomputes or fails by policy).
   */
  private notifyRemoteBlocks(n: NotifyReqMeta): void {
    const { requestId, transferId, localBlockIds: local, remoteEngineId, remoteHost: host, remotePort: port, skipBlocks } = n;
    // Only the pages after decode's prefix hit are granted (attention groups; Mamba groups have no hit).
    const writable = local.map((ids, g) => (g < this.numAttnGroups ? ids.slice(skipBlocks) : ids));
    const rec = { requestId, deadlineMs: this.env.nowMs() + this.config.transferTimeoutMs, blockIds: writable.flat(), aborted: false };
    this.recvTransfers.set(transferId, rec);
    let engineId: string;
    try {
      engineId = this.readyPeer(host, port, remoteEngineId);
    } catch (e) {
      if (!isHandoffError(e)) throw e;
      rec.deadlineMs = this.env.nowMs(); // nothing can be written: fail the load now
      this.log?.warn({ requestId, transferId, err: e.message }, 'could not tell the producer where to write');
      return;
    }
    const grant = this.transfer.issueGrant({ transferId, peerEngineId: engineId, blockIds: writable.flat(), ttlMs: this.config.leaseMs });
    this.transfer.notify(engineId, { type: 'remote_blocks', transferId, payload: { blockIds: local, skipBlocks, grant: grant.token } }).catch((e: unknown) => {
      if (!isHandoffError(e)) throw e;
      this.log?.warn({ requestId, transferId, err: e.message }, 'could not tell the producer where to write; the load fails at its deadline');
    });
  }

  /** WRITE producer: push every save whose destination is known. */
  private startReadySaves(): void {
    for (const [transferId, save] of this.pendingSaves) {
      const dest = this.remoteBlocks.get(transferId);
      if (!dest || this.savesInFlight.has(transferId)) continue;
      this.pendingSaves.delete(transferId);
      this.remoteBlocks.delete(transferId);
      this.savesInFlight.add(transferId);
      void this.push(save, dest).finally(() => {
        this.savesInFlight.delete(transferId);
        this.finishedSaves.push(save.requestId);
        this.onActivity?.();
      });
    }
  }

  private async push(save: SaveReqMeta, dest: RemoteBlocks): Promise<void> {
    try {
      // Page i goes to decode's page i (decode may have a longer tail), except decode's prefix hit.
      const pairs = save.localBlockIds.map((ids, g) => {
        const a = alignReadBlocks(dest.blockIds[g] ?? [], ids, Infinity);
        const skip = g < this.numAttnGroups ? dest.skipBlocks : 0;
        return { local: a.local.slice(skip), remote: a.remote.slice(skip) };
      });
      const { ranges, footprint } = this.rangesFor(
        pairs.map((p) => p.remote),
        pairs.map((p) => p.local),
      );
      this.stats.writesPosted++;
      const h = this.transfer.postWrite({
        peerEngineId: dest.fromEngineId,
        transferId: save.transferId,
        grantToken: dest.grant,
        ranges,
        label: { what: 'kv-write', requestIds: [save.requestId] },
        footprint: footprint.map((f) => ({ ...f, write: false })),
      });
      if (this.config.mutant === 'write-done-early') {
        // Mutant: completion announced before the destination has the data.
        await this.transfer.notify(dest.fromEngineId, { type: 'write_done', transferId: save.transferId, payload: { grant: dest.grant } });
        await this.transfer.wait([h], this.config.transferTimeoutMs);
        return;
      }
      await this.transfer.wait([h], this.config.transferTimeoutMs);
      await this.transfer.notify(dest.fromEngineId, { type: 'write_done', transferId: save.transferId, payload: { grant: dest.grant } });
    } catch (e) {
      rethrowIfAssertion(e);
      this.log?.warn({ transferId: save.transferId, err: String(e) }, 'KV WRITE failed; decode will time out and recompute');
    }
  }

  /** The runner's hook after the forward: what finished sending/receiving, and loads that failed. */
  async postForward(_so: SchedulerOutput): Promise<KVConnectorOutput> {
    for (const late of this.lateReads.splice(0)) {
      await this.transfer.wait([late.handle], this.config.transferTimeoutMs).catch((e: unknown) => rethrowIfAssertion(e));
      this.release(late.r);
    }
    this.startReadySaves();
    const { finishedSending, finishedRecving } = this.getFinished();
    const failed = this.expireWriteLoads();
    return { ...emptyConnectorOutput(), finishedSending: [...finishedSending, ...failed.releasedAborted], finishedRecving, ...failed.loads };
  }

  /**
   * vLLM's get_finished: requests whose pages may now be freed on this side (producer: released by the
   * peer or WRITE done; consumer: aborted loads no WRITE can reach) and WRITE loads that completed.
   */
  getFinished(): { finishedSending: string[]; finishedRecving: string[] } {
    const finishedSending: string[] = [];
    for (const t of [...this.released]) {
      const reqId = this.sendTransfers[t];
      if (reqId === undefined) continue; // not mapped yet: kept until the metadata arrives or the lease ends
      this.released.delete(t);
      finishedSending.push(reqId);
    }
    if (this.released.size > 1024) this.released.clear(); // bound: stale releases of expired transfers
    finishedSending.push(...this.finishedSaves, ...this.releasedAborted);
    this.finishedSaves = [];
    this.releasedAborted = [];
    const finishedRecving = this.finishedRecving;
    this.finishedRecving = [];
    return { finishedSending, finishedRecving };
  }

  /** WRITE loads past their deadline: aborted ones may be freed now, live ones failed (vLLM's get_block_ids_with_load_errors). */
  private expireWriteLoads(): {
    releasedAborted: string[];
    loads: Pick<KVConnectorOutput, 'failedLoadReqIds' | 'invalidBlockIds' | 'loadErrors'>;
  } {
    const releasedAborted: string[] = [];
    const loads: Pick<KVConnectorOutput, 'failedLoadReqIds' | 'invalidBlockIds' | 'loadErrors'> = { failedLoadReqIds: [], invalidBlockIds: [], loadErrors: {} };
    const now = this.env.nowMs();
    for (const [transferId, rec] of this.recvTransfers) {
      if (rec.deadlineMs > now) continue;
      // Stop accepting the producer's WRITEs into these pages first.
      this.recvTransfers.delete(transferId);
      this.transfer.revokeGrant(transferId);
      if (rec.aborted) {
        releasedAborted.push(rec.requestId); // past the deadline no WRITE of the producer lands
        continue;
      }
      loads.failedLoadReqIds.push(rec.requestId);
      loads.invalidBlockIds.push(...rec.blockIds);
      loads.loadErrors[rec.requestId] = { code: 'TIMEOUT', message: `the producer did not write within ${this.config.transferTimeoutMs} ms` };
    }
    return { releasedAborted, loads };
  }

  /** READ latencies since the last call (ms). */
  drainReadLatencies(): number[] {
    const out = this.readLatenciesMs;
    this.readLatenciesMs = [];
    return out;
  }

  hasPendingWork(): boolean {
    return this.pendingSaves.size > 0 || this.savesInFlight.size > 0 || this.recvTransfers.size > 0;
  }

  close(): void {
    this.unsubscribe();
  }
}
