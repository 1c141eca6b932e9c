/**
 * `sim` backend: a TransferEngine whose NIC is the simulator. postRead/postWrite check and queue a
 * work request on the SimFabric (sim_fabric.ts); it moves bytes between the two engines' slabs, under
 * the serving side's GrantTable, only when the explorer runs it. Notifications and handshakes go
 * through the same queue, so the explorer also decides when (and whether) they arrive.
 *
 *   D.postRead ──> fabric [wr] ──run──> P.grants.check ──> copy P slab -> D slab ──> D handle done
 *   D.notify   ──> fabric [msg] ──run──> P handlers, then D's notify() resolves (the ack)
 *
 * Same contract as inproc/tcp (conformance.ts): grants, typed failures, poll/wait/abort, faults,
 * race-checker hooks (nicPost at post, nicObserved when the host first sees the completion).
 * Addresses are `sim://<engineId>`; engines find each other through their fabric.
 */
import { checkLocalRanges, dispatchNotification, workRequestProblem } from './handle_wait.ts';
import { timingSafeEqual } from 'node:crypto';
import type { RaceCheckerLike } from '../device/types.ts';
import { assert, rethrowIfAssertion } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import { HandoffError, type ErrorCode } from '../util/errors.ts';
import { createLogger } from '../util/log.ts';
import { buildMetadata, compatibilityProblem } from './metadata.ts';
import { coalesceRanges, disjoint, localSide, remoteSide, totalBytes } from './ranges.ts';
import { SimFabric, type FabricFault, type FabricItem } from './sim_fabric.ts';
import { SimGrants } from './sim_grants.ts';
import { SimHandles, type HandleState } from './sim_handles.ts';
import {
  NOTIFICATION_TYPES,
  type EngineMetadata, type Grant, type GrantRequest, type Notification, type NotificationHandler, type PeerAddress,
  type PollResult, type SlabLayout, type TransferEngine, type TransferEngineOptions, type TransferHandle,
  type TransferRequest, type TransferStats,
} from './types.ts';

const SCHEME = 'sim://';

/** Engines created through createTransferEngine share this auto-running fabric (tests, conformance). */
const defaultFabric = new SimFabric(true);
const registries = new WeakMap<SimFabric, Map<string, SimTransferEngine>>();

function registryOf(f: SimFabric): Map<string, SimTransferEngine> {
  let r = registries.get(f);
  if (r === undefined) registries.set(f, (r = new Map()));
  return r;
}

function sameSecret(a: string | undefined, b: string | undefined): boolean {
  if (a === undefined || b === undefined) return a === b;
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

export interface SimTransferEngineOptions extends Omit<TransferEngineOptions, 'backend' | 'slabs'> {
  fabric: SimFabric;
  /** Views of the registered slabs (a sim device's slabs, or views of SharedArrayBuffers). */
  slabViews: Uint8Array[];
}


type Counters = Omit<TransferStats, 'badFrames' | 'grantsIssued' | 'grantsRefused' | 'grantsExpired'>;

export class SimTransferEngine implements TransferEngine {
  readonly backend = 'sim' as const;
  readonly engineId: string;
  readonly metadata: EngineMetadata;
  readonly fabric: SimFabric;
  private readonly env: Env;
  private readonly layout: SlabLayout;
  private readonly slabs: Uint8Array[];
  private readonly opts: SimTransferEngineOptions;
  private readonly grants: SimGrants;
  private readonly peers = new Map<string, EngineMetadata>();
  private readonly handles: SimHandles;
  private readonly handlers = new Set<NotificationHandler>();
  private rc: RaceCheckerLike | null = null;
  private nextWrId = 1;
  private closed = false;
  private readonly counters: Counters = {
    bytesRead: 0, bytesWritten: 0, readsPosted: 0, readsFailed: 0, writesPosted: 0, writesFailed: 0, descriptorsPosted: 0,
    handshakesRefused: 0, notificationsSent: 0, notificationsFailed: 0, releasesRefused: 0,
  };

  /** The factory's path: an engine on the shared auto-running fabric over SharedArrayBuffer slabs. */
  static async create(opts: TransferEngineOptions): Promise<SimTransferEngine> {
    const { backend: _backend, slabs, ...rest } = opts;
    return new SimTransferEngine({ ...rest, fabric: defaultFabric, slabViews: slabs.map((b) => new Uint8Array(b)) });
  }

  constructor(opts: SimTransferEngineOptions) {
    const registry = registryOf(opts.fabric);
    if (registry.has(opts.engineId)) throw new HandoffError('BAD_CONFIG', `sim engine ${opts.engineId} already exists`);
    const { numSlabs, numBlocks, pageBytes } = opts.layout;
    assert(opts.slabViews.length === numSlabs, `expected ${numSlabs} slabs, got ${opts.slabViews.length}`);
    assert(opts.slabViews.every((s) => s.byteLength === numBlocks * pageBytes), 'every slab is numBlocks x pageBytes');
    this.opts = opts;
    this.engineId = opts.engineId;
    this.env = opts.env;
    this.fabric = opts.fabric;
    this.layout = opts.layout;
    this.slabs = opts.slabViews;
    this.metadata = buildMetadata(opts);
    this.handles = new SimHandles(opts.engineId, opts.env, this.counters, (itemId) => this.fabric.emit({ t: 'observed', engineId: this.engineId, itemId }));
    this.grants = new SimGrants(opts.engineId, opts.env, opts.fabric, opts.layout);
    registry.set(this.engineId, this);
  }

  address(): PeerAddress {
    return { host: `${SCHEME}${this.engineId}`, port: 0 };
  }
  ports(): { sideChannel: number; data: number } {
    return { sideChannel: 0, data: 0 };
  }
  attachRaceChecker(rc: RaceCheckerLike | null): void {
    this.rc = rc;
  }
  get isClosed(): boolean {
    return this.closed;
  }

  // ---- grants (serving side) ----

  issueGrant(req: GrantRequest): Grant {
    assert(!this.closed, 'issueGrant after close');
    return this.grants.issue(req);
  }

  revokeGrant(transferId: string): boolean {
    return this.grants.end(transferId, 'revoked');
  }

  // ---- handshake ----

  handshake(peer: PeerAddress): Promise<EngineMetadata> {
    if (this.closed) return Promise.reject(new HandoffError('PEER_UNAVAILABLE', 'engine is closed'));
    if (!peer.host.startsWith(SCHEME)) return Promise.reject(new HandoffError('PEER_UNAVAILABLE', `${peer.host} is not a sim address`));
    const to = peer.host.slice(SCHEME.length);
    const done = new Promise<EngineMetadata>((resolve, reject) => {
      const item: FabricItem = {
        id: this.fabric.newItemId(), kind: 'handshake', from: this.engineId, to, label: { what: 'handshake' }, bytes: 0, transferId: null,
        notBeforeMs: this.env.nowMs(),
        run: () => {
          try {
            resolve(this.completeHandshake(to));
          } catch (e) {
            reject(e);
          }
        },
        cancel: (err) => reject(err),
      };
      this.fabric.enqueue(item);
    });
    return this.withTimeout(done, this.opts.handshakeTimeoutMs ?? 5000, 'PEER_UNAVAILABLE', `handshake with ${peer.host}`);
  }

  private completeHandshake(to: string): EngineMetadata {
    const remote = registryOf(this.fabric).get(to);
    if (this.closed) throw new HandoffError('PEER_UNAVAILABLE', 'engine is closed');
    if (remote === undefined || remote.closed) throw new HandoffError('PEER_UNAVAILABLE', `no sim engine ${to}`);
    if (!sameSecret(this.opts.sideChannelSecret, remote.opts.sideChannelSecret)) {
      remote.counters.handshakesRefused++;
      throw new HandoffError('UNAUTHORIZED', `handshake with ${to} refused: side channel secret mismatch`);
    }
    const problem = compatibilityProblem(this.metadata, remote.metadata) ?? compatibilityProblem(remote.metadata, this.metadata);
    if (problem !== null) {
      remote.counters.handshakesRefused++;
      throw new HandoffError('PEER_INCOMPATIBLE', problem);
    }
    this.peers.set(remote.engineId, remote.metadata);
    remote.peers.set(this.engineId, this.metadata);
    return remote.metadata;
  }

  // ---- work requests ----

  postRead(req: TransferRequest): TransferHandle {
    return this.post('read', req);
  }
  postWrite(req: TransferRequest): TransferHandle {
    return this.post('write', req);
  }

  private post(kind: 'read' | 'write', req: TransferRequest): TransferHandle {
    checkLocalRanges(req, this.layout);
    assert(kind === 'write' || disjoint(localSide(req.ranges)), 'READ destinations overlap');
    const ranges = coalesceRanges(req.ranges);
    const handle: TransferHandle = Object.freeze({
      id: this.nextWrId++, kind, peerEngineId: req.peerEngineId, transferId: req.transferId, bytes: totalBytes(ranges), descriptors: ranges.length,
    });
    const rc = this.rc;
    const st = this.handles.add(handle, rc, rc ? rc.nicPost(req.label, req.footprint) : null);
    if (kind === 'read') this.counters.readsPosted++;
    else this.counters.writesPosted++;
    this.counters.descriptorsPosted += ranges.length;

    if (this.closed) return this.failNow(st, 'TRANSFER_FAILED', 'engine is closed');
    const problem = workRequestProblem(req, ranges, this.peers.get(req.peerEngineId)?.layout);
    if (problem !== null) return this.failNow(st, problem.code, problem.message);
    const inflightMax = this.opts.inflightMax ?? 1024;
    if (this.handles.inflight.size >= inflightMax) return this.failNow(st, 'OVERLOADED', `${inflightMax} work requests already in flight`);

    const f = this.opts.faults ?? {};
    const injected = kind === 'read' && (f.readErrorRate ?? 0) > 0 && this.env.rng.next() < (f.readErrorRate ?? 0);
    const delayMs = kind === 'read' ? (f.readDelayMs ?? 0) : 0;
    const item: FabricItem = {
      id: this.fabric.newItemId(), kind, from: this.engineId, to: req.peerEngineId, label: req.label, bytes: handle.bytes, transferId: req.transferId,
      notBeforeMs: this.env.nowMs() + delayMs,
      run: (fault) => this.execute(st, item, ranges, req.grantToken, injected ? 'fail' : fault),
      cancel: (err) => this.failItem(st, item, err.code, err.message),
    };
    st.itemId = item.id;
    this.handles.inflight.set(handle.id, st);
    this.fabric.emit({ t: 'post', item, rcId: st.rcId, local: localSide(ranges), remote: remoteSide(ranges) });
    if (this.fabric.autoRun && delayMs > 0) {
      this.env.setTimer(delayMs, () => st.state === 'pending' && this.fabric.enqueue(item));
    } else {
      this.fabric.enqueue(item);
    }
    return handle;
  }

  private execute(st: HandleState, item: FabricItem, ranges: ReturnType<typeof coalesceRanges>, token: string, fault: FabricFault | null): void {
    if (st.state !== 'pending') return;
    const remote = registryOf(this.fabric).get(item.to);
    if (this.closed || remote === undefined || remote.closed || !remote.peers.has(this.engineId)) {
      return this.failItem(st, item, 'PEER_UNAVAILABLE', `peer ${item.to} is gone`);
    }
    if (fault === 'fail') return this.failItem(st, item, 'TRANSFER_FAILED', `injected fault: ${item.kind} of transfer ${item.transferId} failed`);
    // The grant is checked where it lives: on the side whose pages are the remote ones.
    const decision = remote.grants.check({
      peerEngineId: this.engineId, transferId: st.handle.transferId, token, ranges: remoteSide(ranges), nowMs: remote.env.nowMs(),
    });
    if (!decision.ok) {
      return this.failItem(st, item, 'GRANT_DENIED', decision.reason);
    }
    for (const r of ranges) {
      const local = this.slabs[r.slab] as Uint8Array;
      const far = remote.slabs[r.slab] as Uint8Array;
      if (item.kind === 'read') local.set(far.subarray(r.remoteOffset, r.remoteOffset + r.length), r.localOffset);
      else far.set(local.subarray(r.localOffset, r.localOffset + r.length), r.remoteOffset);
    }
    this.fabric.emit({ t: 'land', item });
    this.handles.finish(st, null, '');
  }

  private failItem(st: HandleState, item: FabricItem, code: ErrorCode, message: string): void {
    if (st.state !== 'pending') return;
    this.fabric.emit({ t: 'fail', item, code });
    this.handles.finish(st, code, message);
  }

  private failNow(st: HandleState, code: ErrorCode, message: string): TransferHandle {
    this.handles.finish(st, code, message);
    return st.handle;
  }

  poll(handle: TransferHandle): PollResult {
    return this.handles.poll(handle);
  }

  wait(handles: readonly TransferHandle[], timeoutMs: number): Promise<void> {
    return this.handles.wait(handles, timeoutMs);
  }

  /** The simulated NIC stops at once: a queued request is taken off the fabric and fails REQUEST_ABORTED. */
  async abort(handles: readonly TransferHandle[]): Promise<void> {
    for (const h of handles) {
      const st = this.handles.stateOf(h);
      if (st.state !== 'pending' || st.itemId === null) continue;
      const item = this.fabric.remove(st.itemId);
      const msg = `work request ${h.id} aborted`;
      if (item !== null) this.failItem(st, item, 'REQUEST_ABORTED', msg);
      else this.handles.finish(st, 'REQUEST_ABORTED', msg); // delayed, not queued yet (autoRun)
      // abort() returning tells the host the NIC is done with these pages: a happens-before edge.
      this.handles.observe(st);
    }
  }

  // ---- notifications ----

  onNotification(handler: NotificationHandler): () => void {
    this.handlers.add(handler);
    return () => this.handlers.delete(handler);
  }

  async notify(peerEngineId: string, notification: Notification): Promise<void> {
    assert(NOTIFICATION_TYPES.includes(notification.type), `unknown notification type ${notification.type}`);
    assert(typeof notification.transferId === 'string' && notification.transferId.length <= 256, 'bad notification transferId');
    const n: Notification = structuredClone(notification);
    try {
      if (this.closed) throw new HandoffError('PEER_UNAVAILABLE', 'engine is closed');
      if (!this.peers.has(peerEngineId)) throw new HandoffError('PEER_UNAVAILABLE', `no handshake with peer ${peerEngineId}`);
      const rate = this.opts.faults?.dropNotificationRate ?? 0;
      const dropped = rate > 0 && this.env.rng.next() < rate;
      const ack = dropped ? new Promise<void>(() => {}) : this.sendNotification(peerEngineId, n);
      await this.withTimeout(ack, this.opts.notifyTimeoutMs ?? 5000, 'TIMEOUT', `${n.type} notification to ${peerEngineId}`);
      this.counters.notificationsSent++;
    } catch (e) {
      rethrowIfAssertion(e);
      this.counters.notificationsFailed++;
      throw e instanceof HandoffError ? e : new HandoffError('PEER_UNAVAILABLE', `notification to ${peerEngineId} failed: ${String(e)}`);
    }
  }

  private sendNotification(to: string, n: Notification): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const make = (ack: boolean): FabricItem => {
        const item: FabricItem = {
          id: this.fabric.newItemId(), kind: 'notify', from: this.engineId, to, label: { what: `notify-${n.type}` }, bytes: 0, transferId: n.transferId,
          notBeforeMs: this.env.nowMs(),
          run: (fault) => {
            const remote = registryOf(this.fabric).get(to);
            const reachable = remote !== undefined && !remote.closed && remote.peers.has(this.engineId);
            const delivered = reachable && fault !== 'drop';
            this.fabric.emit({ t: 'notify-deliver', item, notification: n, delivered });
            if (!reachable) return ack ? reject(new HandoffError('PEER_UNAVAILABLE', `peer ${to} is gone`)) : undefined;
            if (fault === 'drop') return; // lost: the sender's notify() times out
            if (fault === 'duplicate') this.fabric.enqueue(make(false));
            remote.deliver(this.engineId, structuredClone(n));
            if (ack) resolve();
          },
          cancel: (err) => (ack ? reject(err) : undefined),
        };
        return item;
      };
      const item = make(true);
      this.fabric.emit({ t: 'notify-send', item, notification: n });
      this.fabric.enqueue(item);
    });
  }

  private deliver(fromEngineId: string, n: Notification): void {
    const ok = dispatchNotification(this.grants, this.handlers, (e) => createLogger(`transfer:${this.engineId}`).error({ err: e, from: fromEngineId, type: n.type }, 'notification handler threw'), fromEngineId, n);
    if (!ok) this.counters.releasesRefused++;
  }

  private withTimeout<T>(p: Promise<T>, ms: number, code: ErrorCode, what: string): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const timer = this.env.setTimer(ms, () => reject(new HandoffError(code, `${what}: no answer after ${ms} ms`)));
      p.then(
        (v) => (timer.cancel(), resolve(v)),
        (e: unknown) => (timer.cancel(), reject(e)),
      );
    });
  }

  stats(): TransferStats {
    const g = this.grants;
    return { ...this.counters, grantsIssued: g.issued, grantsRefused: g.refused, grantsExpired: g.expired, badFrames: 0 };
  }

  /** Close (or, in the simulator, kill): everything queued from or to this engine fails PEER_UNAVAILABLE. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.grants.clear();
    const registry = registryOf(this.fabric);
    if (registry.get(this.engineId) === this) registry.delete(this.engineId);
    for (const other of registry.values()) other.peers.delete(this.engineId);
    this.peers.clear();
    const err = new HandoffError('PEER_UNAVAILABLE', `engine ${this.engineId} closed`);
    this.fabric.cancelWhere((i) => i.from === this.engineId || i.to === this.engineId, err);
    for (const st of [...this.handles.inflight.values()]) this.handles.finish(st, 'PEER_UNAVAILABLE', err.message);
    this.fabric.emit({ t: 'engine-closed', engineId: this.engineId });
  }
}
