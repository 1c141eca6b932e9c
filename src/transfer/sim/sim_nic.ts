/**
 * The `sim` backend's NIC: each posted work request becomes an item on the SimFabric (sim_fabric.ts)
 * that moves bytes between the two engines' slabs, under the serving side's GrantTable, only when the
 * simulator's explorer runs it (or at the next microtask on an auto-running fabric). Completions are
 * pushed to the core synchronously (`cq` inside run/cancel/abort), so the completion queue itself is
 * never consulted: slotState() always reads pending.
 *
 *   core.post ──> [fabric item] ──run(fault)──> peer NIC's grants.check ──> copy ──> cq to core
 *
 * Every work request, landing, failure, observation and grant change is emitted on the fabric, so the
 * simulator's oracles follow each page without touching the engines. The NIC finds its peer's NIC
 * through `reach`, which the engine sets: null when either side is closed or they never shook hands.
 */
import { assert } from '../../util/assert.ts';
import type { Env } from '../../util/env.ts';
import type { ErrorCode } from '../../util/errors.ts';
import { GrantTable, type GrantDecision, type GrantQuery } from '../core/grant_table.ts';
import {
  CQ_PENDING,
  type GrantEnd,
  type Nic,
  type NicCompletionEvent,
  type NicStats,
  type NicWorkRequest,
} from '../core/nic.ts';
import { localSide, remoteSide, sideBytes, sideOf, unpackRanges } from '../core/ranges.ts';
import type { FabricFault, FabricItem, SimFabric } from './sim_fabric.ts';
import type { SlabLayout } from '../core/types.ts';

const GRANTS_MAX = 65_536;

interface Pending {
  wr: NicWorkRequest;
  item: FabricItem;
}

export interface SimNicOptions {
  engineId: string;
  env: Env;
  fabric: SimFabric;
  layout: SlabLayout;
  slabs: Uint8Array[];
  slotsMax: number;
}

export class SimNic implements Nic {
  readonly slotsMax: number;
  /** The peer's NIC when a work request may reach it now, else null. Set by the engine. */
  reach: (peerEngineId: string) => SimNic | null = () => null;
  private readonly engineId: string;
  private readonly env: Env;
  private readonly fabric: SimFabric;
  private readonly slabs: Uint8Array[];
  private readonly layout: SlabLayout;
  private readonly table: GrantTable;
  private readonly grantRecords = new Map<
    string,
    { peerEngineId: string | null; blockIds: number[]; token: string; expiresAtMs: number }
  >();
  /**
   * Grants revoked while peers' work requests under them were queued: a real NIC may be serving them
   * already (the grant was checked when they started), so each may still move bytes until it settles;
   * the grant's end is announced, and drainGrant resolves, only then. New requests are refused at once.
   */
  private readonly draining = new Map<
    string,
    { table: GrantTable; itemIds: Set<number>; waiters: Array<() => void> }
  >();
  private readonly pending = new Map<number, Pending>();
  /** Fabric item of each settled work request the host has not observed yet. */
  private readonly unobserved = new Map<number, number>();
  private readonly listeners = new Set<(ev: NicCompletionEvent) => void>();
  private slotsInUse = 0;
  private nextSlot = 0;
  private refused = 0;

  constructor(o: SimNicOptions) {
    this.engineId = o.engineId;
    this.env = o.env;
    this.fabric = o.fabric;
    this.slabs = o.slabs;
    this.slotsMax = o.slotsMax;
    this.layout = o.layout;
    this.table = new GrantTable(o.layout, GRANTS_MAX);
  }

  /** Completion-queue slots taken (work requests posted and not finished): 0 when the NIC is idle. */
  get slotsTaken(): number {
    return this.slotsInUse;
  }

  allocSlot(): number | null {
    if (this.slotsInUse >= this.slotsMax) return null;
    this.slotsInUse++;
    return this.nextSlot++;
  }

  freeSlot(_slot: number): void {
    assert(this.slotsInUse > 0, 'sim NIC slot freed twice');
    this.slotsInUse--;
  }

  slotState(_slot: number): { state: number; code: ErrorCode } {
    return { state: CQ_PENDING, code: 'TRANSFER_FAILED' };
  }

  post(posted: NicWorkRequest): void {
    const wr = { ...posted, ranges: posted.ranges.slice() }; // the poster reuses its buffer
    const item: FabricItem = {
      id: this.fabric.newItemId(),
      kind: wr.kind,
      from: this.engineId,
      to: wr.peerEngineId,
      label: wr.label,
      bytes: sideBytes(sideOf(wr.ranges, 'local')),
      transferId: wr.transferId,
      notBeforeMs: this.env.nowMs() + wr.delayMs,
      run: (fault) => this.execute(wr, item, wr.failWith !== null ? 'fail' : fault),
      cancel: (err) => this.failItem(wr.wrId, item, err.code, err.message),
    };
    this.pending.set(wr.wrId, { wr, item });
    this.unobserved.set(wr.wrId, item.id);
    this.fabric.emit({
      t: 'post',
      item,
      rcId: wr.checkerWrId,
      local: localSide(unpackRanges(wr.ranges)),
      remote: remoteSide(unpackRanges(wr.ranges)),
    });
    if (this.fabric.autoRun && wr.delayMs > 0) {
      this.env.setTimer(wr.delayMs, () => this.pending.has(wr.wrId) && this.fabric.enqueue(item));
    } else {
      this.fabric.enqueue(item);
    }
  }

  private execute(wr: NicWorkRequest, item: FabricItem, fault: FabricFault | null): void {
    if (!this.pending.has(wr.wrId)) return;
    const remote = this.reach(item.to);
    if (remote === null) return this.failItem(wr.wrId, item, 'PEER_UNAVAILABLE', `peer ${item.to} is gone`);
    if (fault === 'fail')
      return this.failItem(
        wr.wrId,
        item,
        'TRANSFER_FAILED',
        `injected fault: ${item.kind} of transfer ${item.transferId} failed`,
      );
    // The grant is checked where it lives: on the side whose pages are the remote ones.
    const decision = remote.checkGrant(item.id, {
      peerEngineId: this.engineId,
      transferId: wr.transferId,
      token: wr.grantToken,
      ranges: sideOf(wr.ranges, 'remote'),
      nowMs: remote.env.nowMs(),
    });
    if (!decision.ok) return this.failItem(wr.wrId, item, 'GRANT_DENIED', decision.reason);
    for (const r of unpackRanges(wr.ranges)) {
      const local = this.slabs[r.slab] as Uint8Array;
      const far = remote.slabs[r.remoteSlab ?? r.slab] as Uint8Array;
      if (item.kind === 'read') local.set(far.subarray(r.remoteOffset, r.remoteOffset + r.length), r.localOffset);
      else far.set(local.subarray(r.localOffset, r.localOffset + r.length), r.remoteOffset);
    }
    this.fabric.emit({ t: 'land', item });
    this.complete(wr.wrId, null, '');
  }

  private failItem(wrId: number, item: FabricItem, code: ErrorCode, message: string): void {
    if (!this.pending.has(wrId)) return;
    this.fabric.emit({ t: 'fail', item, code });
    this.complete(wrId, code, message);
  }

  private complete(wrId: number, code: ErrorCode | null, message: string): void {
    this.pending.delete(wrId);
    this.emit({ t: 'cq', wrId, code, message });
  }

  /**
   * A real NIC stops a work request only once it answers `aborted`: until then the request may still run
   * (land) or fail. Under the explorer (no autoRun) the abort is a fabric item of its own, so every order of
   * the request and its abort is explored; with autoRun the simulated NIC stops at once: a queued request is
   * taken off the fabric and fails REQUEST_ABORTED.
   */
  abort(wrId: number): void {
    const queued = this.pending.get(wrId);
    if (queued !== undefined && !this.fabric.autoRun && this.fabric.has(queued.item.id)) {
      const stop = (): void => this.stopNow(wrId);
      // A request the NIC was slow to take may be under way right now: it may still land before the stop.
      queued.item.notBeforeMs = Math.min(queued.item.notBeforeMs, this.env.nowMs());
      this.fabric.enqueue({
        id: this.fabric.newItemId(),
        kind: 'handshake', // host-to-NIC control: no data, never faulted by the explorer
        from: this.engineId,
        to: queued.item.to,
        label: {
          what: 'nic-abort',
          ...(queued.item.label.requestIds ? { requestIds: queued.item.label.requestIds } : {}),
        },
        bytes: 0,
        transferId: queued.item.transferId,
        notBeforeMs: this.env.nowMs(),
        run: stop,
        cancel: stop,
      });
      return;
    }
    this.stopNow(wrId);
  }

  private stopNow(wrId: number): void {
    const p = this.pending.get(wrId);
    if (p !== undefined) {
      const msg = `work request ${wrId} aborted`;
      if (this.fabric.remove(p.item.id) !== null) this.failItem(wrId, p.item, 'REQUEST_ABORTED', msg);
      else this.complete(wrId, 'REQUEST_ABORTED', msg); // delayed, not queued yet (autoRun)
    }
    this.emit({ t: 'aborted', wrId });
  }

  observed(wrId: number): void {
    const itemId = this.unobserved.get(wrId);
    if (itemId === undefined) return;
    this.unobserved.delete(wrId);
    this.fabric.emit({ t: 'observed', engineId: this.engineId, itemId });
  }

  // ---- grants (this NIC's pages, checked when a peer's work request runs) ----

  grant(transferId: string, token: string, peerEngineId: string | null, blockIds: number[], ttlMs: number): void {
    this.table.add({ transferId, token, peerEngineId, blockIds, expiresAtMs: this.env.nowMs() + ttlMs });
    this.grantRecords.set(transferId, { peerEngineId, blockIds, token, expiresAtMs: this.env.nowMs() + ttlMs });
    this.fabric.emit({ t: 'grant', engineId: this.engineId, change: 'issued', transferId, blockIds, peerEngineId });
  }

  /** Resolves once no work request admitted under the grant can move bytes any more. */
  drainGrant(transferId: string): Promise<void> {
    const d = this.draining.get(transferId);
    if (d === undefined) return Promise.resolve();
    return new Promise((resolve) => d.waiters.push(resolve));
  }

  revokeGrant(transferId: string, why: GrantEnd): void {
    const g = this.grantRecords.get(transferId);
    assert(g !== undefined, `sim NIC: revoke of unknown grant ${transferId}`);
    this.grantRecords.delete(transferId);
    this.table.revoke(transferId);
    const announce = (): void =>
      this.fabric.emit({
        t: 'grant',
        engineId: this.engineId,
        change: why,
        transferId,
        blockIds: g.blockIds,
        peerEngineId: g.peerEngineId,
      });
    const admitted = this.fabric.autoRun
      ? []
      : this.fabric
          .queued()
          .filter(
            (i) => i.to === this.engineId && i.transferId === transferId && (i.kind === 'read' || i.kind === 'write'),
          );
    if (admitted.length === 0 || this.draining.has(transferId)) return announce();
    const table = new GrantTable(this.layout, 1);
    table.add({
      transferId,
      token: g.token,
      peerEngineId: g.peerEngineId,
      blockIds: g.blockIds,
      expiresAtMs: Infinity,
    });
    const d = {
      table,
      itemIds: new Set(admitted.map((i) => i.id)),
      waiters: [] as Array<() => void>,
    };
    const off = this.fabric.onEvent((ev) => {
      if ((ev.t !== 'land' && ev.t !== 'fail') || !d.itemIds.delete(ev.item.id) || d.itemIds.size > 0) return;
      off();
      this.draining.delete(transferId);
      announce();
      for (const w of d.waiters) w();
    });
    this.draining.set(transferId, d);
  }

  private checkGrant(itemId: number, q: GrantQuery): GrantDecision {
    let d = this.table.check(q);
    const drain = this.draining.get(q.transferId);
    if (!d.ok && drain !== undefined && drain.itemIds.has(itemId)) d = drain.table.check(q);
    if (!d.ok) this.refused++;
    return d;
  }

  onCompletion(fn: (ev: NicCompletionEvent) => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  private emit(ev: NicCompletionEvent): void {
    for (const fn of [...this.listeners]) fn(ev);
  }

  stats(): NicStats {
    return { grantsRefused: this.refused, badFrames: 0, scatterReads: 0, writesCut: 0 };
  }

  nowEpochMs(): number {
    return this.env.nowMs();
  }

  /** The engine has cancelled this NIC's fabric items already; tell the oracles it is gone. */
  close(): void {
    this.unobserved.clear();
    this.fabric.emit({ t: 'engine-closed', engineId: this.engineId });
  }
}
