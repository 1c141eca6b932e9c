/**
 * What every backend shares on the engine thread: grant issuance (token, expiry timer, revocation),
 * posting work requests (validation, coalescing, faults, race-checker hooks), completion tracking
 * (poll/wait/abort), notifications (drop faults, timeout) and stats. A backend adds the side channel
 * (handshake, notify transport) and its NIC (nic.ts): the thread NIC (inproc, tcp) or the simulator's
 * fabric (sim).
 *
 * Handle lifecycle: pending -> done | failed, exactly once. The race checker's nicObserved is called
 * once, when the host first sees the terminal state through poll() or wait().
 */
import type { RaceCheckerLike } from '../../device/types.ts';
import {
  checkLocalRanges,
  dispatchNotification,
  settleHandle,
  waitForHandles,
  workRequestProblem,
} from './handle_wait.ts';
import { assert, rethrowIfAssertion } from '../../util/assert.ts';
import { observed } from '../../device/observed_promise.ts';
import type { Env } from '../../util/env.ts';
import { HandoffError, isHandoffError, type ErrorCode } from '../../util/errors.ts';
import { createLogger, type Logger } from '../../util/log.ts';
import { GrantIssuer } from './grant_issuer.ts';
import { buildMetadata } from './metadata.ts';
import { CQ_DONE, CQ_FAILED, type Nic, type NicCompletionEvent } from './nic.ts';
import { WorkRequestLog, type WorkRequestRecord } from './work_log.ts';
import { PACKED_STRIDE, sideBytes, sideOf } from './ranges.ts';
import { RangeScratch } from './range_scratch.ts';
import {
  NOTIFICATION_TYPES,
  type EngineMetadata,
  type Grant,
  type GrantRequest,
  type Notification,
  type NotificationHandler,
  type PeerAddress,
  type PollResult,
  type SlabLayout,
  type TransferBackend,
  type TransferEngine,
  type TransferEngineOptions,
  type TransferFaults,
  type TransferHandle,
  type TransferRequest,
  type TransferStats,
} from './types.ts';

interface HandleState {
  handle: TransferHandle;
  slot: number | null;
  state: 'pending' | 'done' | 'failed';
  error: HandoffError | null;
  rc: RaceCheckerLike | null;
  rcId: number | null;
  observed: boolean;
  waiters: Set<() => void>;
  /** Its entry in the opt-in work-request log, if on. */
  log: WorkRequestRecord | null;
}

type HostCounters = Omit<
  TransferStats,
  'grantsRefused' | 'badFrames' | 'scatterReads' | 'writesCut' | 'grantsIssued' | 'grantsExpired'
>;

/** What the core takes from TransferEngineOptions (the registered slabs belong to the NIC). */
export type TransferEngineCoreOptions = Omit<TransferEngineOptions, 'backend' | 'slabs'>;

export abstract class TransferEngineCore<N extends Nic = Nic> implements TransferEngine {
  abstract readonly backend: TransferBackend;
  readonly engineId: string;
  readonly metadata: EngineMetadata;
  protected readonly env: Env;
  protected readonly layout: SlabLayout;
  protected readonly secret: string | undefined;
  protected readonly faults: Required<TransferFaults>;
  protected readonly notifyTimeoutMs: number;
  protected readonly handshakeTimeoutMs: number;
  /** Peers we completed a handshake with (either direction). */
  protected readonly peers = new Map<string, EngineMetadata>();
  protected readonly counters: HostCounters = {
    bytesRead: 0,
    bytesWritten: 0,
    readsPosted: 0,
    readsFailed: 0,
    writesPosted: 0,
    writesFailed: 0,
    descriptorsPosted: 0,
    handshakesRefused: 0,
    notificationsSent: 0,
    notificationsFailed: 0,
    releasesRefused: 0,
  };
  private rc: RaceCheckerLike | null = null;
  private readonly grants: GrantIssuer;
  private readonly inflight = new Map<number, HandleState>();
  private readonly states = new WeakMap<TransferHandle, HandleState>();
  private readonly handlers = new Set<NotificationHandler>();
  private readonly abortWaiters = new Map<number, Array<() => void>>();
  private nextWrId = 1;
  private logger: Logger | null = null;
  private closed = false;
  private closing: Promise<void> | null = null;
  private workLog: WorkRequestLog | null = null;
  private readonly scratch = new RangeScratch();

  protected constructor(
    opts: TransferEngineCoreOptions,
    protected readonly nic: N,
  ) {
    this.engineId = opts.engineId;
    this.env = opts.env;
    this.layout = opts.layout;
    this.secret = opts.sideChannelSecret;
    this.metadata = buildMetadata(opts);
    const f = opts.faults ?? {};
    this.faults = {
      readErrorRate: f.readErrorRate ?? 0,
      readDelayMs: f.readDelayMs ?? 0,
      dropNotificationRate: f.dropNotificationRate ?? 0,
      leakFailedSlots: f.leakFailedSlots ?? false,
    };
    this.notifyTimeoutMs = opts.notifyTimeoutMs ?? 5000;
    this.handshakeTimeoutMs = opts.handshakeTimeoutMs ?? 5000;
    this.grants = new GrantIssuer(opts.env, nic, opts.layout.numBlocks);
    nic.onCompletion((ev) => this.onNicEvent(ev));
  }

  abstract address(): PeerAddress;
  abstract ports(): { sideChannel: number; data: number };
  /**
   * Connect and handshake. `abandoned` fires when handshake() gave up (timeout): the backend must then
   * close whatever it opened for this attempt, or a peer that accepts and never answers leaks a socket.
   */
  protected abstract handshakeImpl(peer: PeerAddress, abandoned: AbortSignal): Promise<EngineMetadata>;
  /** Deliver to the peer and resolve when it acknowledged. */
  protected abstract sendNotification(peerEngineId: string, n: Notification): Promise<void>;
  /** Void when the transport closes at once (sim). */
  protected abstract closeTransport(): Promise<void> | void;

  get isClosed(): boolean {
    return this.closed;
  }

  /** Created on first use: the simulator builds thousands of engines that never log. */
  protected get log(): Logger {
    return (this.logger ??= createLogger(`transfer:${this.engineId}`));
  }

  attachRaceChecker(rc: RaceCheckerLike | null): void {
    this.rc = rc;
  }

  /** Log work requests posted from now on, with host-observed post and completion times (idempotent). */
  startWorkLog(): void {
    this.workLog ??= new WorkRequestLog(this.nic);
  }

  /** The logged work requests in post order; empty when the log was never started. */
  workLogEntries(): WorkRequestRecord[] {
    return this.workLog?.entries() ?? [];
  }

  // ---- grants (serving side) ----

  issueGrant(req: GrantRequest): Grant {
    assert(!this.isClosed, 'issueGrant after close');
    return this.grants.issue(req);
  }

  revokeGrant(transferId: string): boolean {
    return this.grants.revoke(transferId);
  }

  drainGrant(transferId: string): Promise<void> {
    return this.nic.drainGrant(transferId);
  }

  // ---- work requests (requesting side) ----

  handshake(peer: PeerAddress): Promise<EngineMetadata> {
    if (this.isClosed) return Promise.reject(new HandoffError('PEER_UNAVAILABLE', 'engine is closed'));
    const abandon = new AbortController();
    return this.withTimeout(
      this.handshakeImpl(peer, abandon.signal),
      this.handshakeTimeoutMs,
      'PEER_UNAVAILABLE',
      `handshake with ${peer.host}:${peer.port}`,
      () => abandon.abort(),
    );
  }

  peerMetadata(peerEngineId: string): EngineMetadata | null {
    return this.peers.get(peerEngineId) ?? null;
  }

  postRead(req: TransferRequest): TransferHandle {
    return this.post('read', req);
  }

  postWrite(req: TransferRequest): TransferHandle {
    return this.post('write', req);
  }

  /** The request's ranges checked (programmer errors), packed and coalesced: a view of the scratch. */
  private prepare(kind: 'read' | 'write', req: TransferRequest): Float64Array {
    const packed = this.scratch.pack(req.ranges);
    checkLocalRanges(packed, this.layout);
    // Coalescing merges only ranges adjacent on both sides, so it hides no overlap: checking the merged
    // ranges (often a handful) is the same check as checking the posted ones (often thousands).
    const ranges = this.scratch.coalesce(packed); // the NIC copies what it keeps
    assert(
      kind === 'write' || this.scratch.disjoint(sideOf(ranges, 'local'), this.layout),
      'READ destinations overlap',
    );
    return ranges;
  }

  private post(kind: 'read' | 'write', req: TransferRequest): TransferHandle {
    const ranges = this.prepare(kind, req);
    const descriptors = ranges.length / PACKED_STRIDE;
    const rc = this.rc;
    const handle: TransferHandle = Object.freeze({
      id: this.nextWrId++,
      kind,
      peerEngineId: req.peerEngineId,
      transferId: req.transferId,
      bytes: sideBytes(sideOf(ranges, 'local')),
      descriptors,
    });
    const st: HandleState = {
      handle,
      slot: null,
      state: 'pending',
      error: null,
      rc,
      rcId: null,
      observed: false,
      waiters: new Set(),
      log: null,
    };
    st.rcId = rc ? rc.nicPost(req.label, req.footprint) : null;
    const wl = this.workLog;
    if (wl !== null)
      st.log = wl.posted(
        {
          wrId: handle.id,
          checkerWrId: st.rcId,
          kind,
          label: req.label,
          transferId: req.transferId,
          bytes: handle.bytes,
        },
        req.footprint,
      );
    this.states.set(handle, st);
    if (kind === 'read') this.counters.readsPosted++;
    else this.counters.writesPosted++;
    this.counters.descriptorsPosted += descriptors;

    if (this.isClosed) return this.failNow(st, 'TRANSFER_FAILED', 'engine is closed');
    const problem = workRequestProblem(req, ranges, this.peers.get(req.peerEngineId)?.layout);
    if (problem !== null) return this.failNow(st, problem.code, problem.message);
    const slot = this.nic.allocSlot();
    if (slot === null) return this.failNow(st, 'OVERLOADED', `${this.nic.slotsMax} work requests already in flight`);
    st.slot = slot;
    this.inflight.set(handle.id, st);
    const faulty = kind === 'read' && this.faults.readErrorRate > 0 && this.env.rng.next() < this.faults.readErrorRate;
    this.nic.post({
      wrId: handle.id,
      slot,
      kind,
      peerEngineId: req.peerEngineId,
      transferId: req.transferId,
      grantToken: req.grantToken,
      ranges,
      label: req.label,
      checkerWrId: st.rcId,
      delayMs: kind === 'read' ? this.faults.readDelayMs : 0,
      failWith: faulty ? 'TRANSFER_FAILED' : null,
    });
    return handle;
  }

  private failNow(st: HandleState, code: ErrorCode, message: string): TransferHandle {
    this.finish(st, code, message);
    return st.handle;
  }

  private finish(st: HandleState, code: ErrorCode | null, message: string): void {
    if (st.state !== 'pending') return;
    if (st.slot !== null && (code === null || !this.faults.leakFailedSlots)) this.nic.freeSlot(st.slot);
    st.slot = null;
    this.inflight.delete(st.handle.id);
    settleHandle(st, code, message, this.counters); // waiters run later (promise callbacks), after the log line
    if (st.log !== null) this.workLog?.finished(st.log, code === null ? 'done' : 'failed');
  }

  private onNicEvent(ev: NicCompletionEvent): void {
    if (ev.t === 'cq') {
      const st = this.inflight.get(ev.wrId);
      if (st) this.finish(st, ev.code, ev.message);
    } else if (ev.t === 'aborted') {
      const ws = this.abortWaiters.get(ev.wrId) ?? [];
      this.abortWaiters.delete(ev.wrId);
      for (const w of ws) w();
    }
  }

  /**
   * Read the completion queue without waiting for the NIC's message. wait() takes only successes
   * from it and lets failures arrive with the NIC's message (it names the reason); poll() cannot wait.
   */
  private refresh(st: HandleState, takeFailures = true): void {
    if (st.state !== 'pending' || st.slot === null) return;
    const { state, code } = this.nic.slotState(st.slot);
    if (state === CQ_DONE) this.finish(st, null, '');
    else if (state === CQ_FAILED && takeFailures) this.finish(st, code, '');
  }

  private stateOf(handle: TransferHandle): HandleState {
    const st = this.states.get(handle);
    assert(st !== undefined, `handle ${handle.id} was not posted by engine ${this.engineId}`);
    return st;
  }

  private observe(st: HandleState): void {
    if (st.state !== 'pending') this.markObserved(st);
  }

  private markObserved(st: HandleState): void {
    if (st.observed) return;
    st.observed = true;
    if (st.rc !== null && st.rcId !== null) st.rc.nicObserved(st.rcId);
    this.nic.observed(st.handle.id);
  }

  poll(handle: TransferHandle): PollResult {
    const st = this.stateOf(handle);
    this.refresh(st);
    if (st.state === 'pending') return { state: 'pending' };
    this.observe(st);
    return st.state === 'done' ? { state: 'done' } : { state: 'failed', error: st.error as HandoffError };
  }

  wait(handles: readonly TransferHandle[], timeoutMs: number): Promise<void> {
    // wait() takes only successes from the completion queue: failures arrive with the NIC's message.
    // The race checker hears of completions when host code continues because of this wait (observed_promise.ts).
    const seen: HandleState[] = [];
    const settled = waitForHandles(
      this.env,
      handles.map((h) => this.stateOf(h)),
      timeoutMs,
      {
        refresh: (st) => this.refresh(st, false),
        observe: (st) => {
          if (st.state !== 'pending') seen.push(st);
        },
      },
    );
    return observed(settled, () => {
      for (const st of seen) this.markObserved(st);
    });
  }

  abort(handles: readonly TransferHandle[]): Promise<void> {
    const sts = handles.map((h) => this.stateOf(h));
    // Once host code continues because of this abort (observed_promise.ts), the host knows the NIC will not
    // touch the pages again: every access the work request made is ordered before what it does next.
    return observed(this.stopAll(sts), () => {
      for (const st of sts) this.markObserved(st);
    });
  }

  private async stopAll(sts: readonly HandleState[]): Promise<void> {
    const waits: Promise<void>[] = [];
    for (const st of sts) {
      this.refresh(st);
      if (st.state !== 'pending' || st.slot === null) continue;
      const id = st.handle.id;
      const aborted = new Promise<void>((resolve) =>
        this.abortWaiters.set(id, [...(this.abortWaiters.get(id) ?? []), resolve]),
      );
      this.nic.abort(id);
      // A synchronous NIC (sim) stopped it at once.
      if (st.state === 'pending') waits.push(aborted);
    }
    if (waits.length > 0) await Promise.all(waits);
  }

  // ---- notifications ----

  onNotification(handler: NotificationHandler): () => void {
    this.handlers.add(handler);
    return () => this.handlers.delete(handler);
  }

  async notify(peerEngineId: string, notification: Notification): Promise<void> {
    assert(NOTIFICATION_TYPES.includes(notification.type), `unknown notification type ${notification.type}`);
    assert(
      typeof notification.transferId === 'string' && notification.transferId.length <= 256,
      'bad notification transferId',
    );
    const n: Notification = structuredClone(notification);
    try {
      if (this.isClosed) throw new HandoffError('PEER_UNAVAILABLE', 'engine is closed');
      if (!this.peers.has(peerEngineId))
        throw new HandoffError('PEER_UNAVAILABLE', `no handshake with peer ${peerEngineId}`);
      const dropped = this.faults.dropNotificationRate > 0 && this.env.rng.next() < this.faults.dropNotificationRate;
      const delivery = dropped ? new Promise<void>(() => {}) : this.sendNotification(peerEngineId, n);
      try {
        await this.withTimeout(delivery, this.notifyTimeoutMs, 'TIMEOUT', `${n.type} notification to ${peerEngineId}`);
      } catch (e) {
        // A real (not fault-injected) silence: the side channel may be stuck (e.g. in TCP backoff after a
        // link cut). Let the backend drop it, so the next use handshakes on a fresh connection.
        if (!dropped && isHandoffError(e) && e.code === 'TIMEOUT') this.sideChannelStalled(peerEngineId);
        throw e;
      }
      this.counters.notificationsSent++;
    } catch (e) {
      rethrowIfAssertion(e);
      this.counters.notificationsFailed++;
      throw isHandoffError(e)
        ? e
        : new HandoffError('PEER_UNAVAILABLE', `notification to ${peerEngineId} failed: ${String(e)}`);
    }
  }

  /** A notification to `peerEngineId` got no answer in time; backends with connections drop theirs. */
  protected sideChannelStalled(_peerEngineId: string): void {}

  /** Called by the backend when a notification arrives from a peer. */
  protected deliver(fromEngineId: string, n: Notification): void {
    const ok = dispatchNotification(
      this.grants,
      this.handlers,
      (e) => this.log.error({ err: e, from: fromEngineId, type: n.type }, 'notification handler threw'),
      fromEngineId,
      n,
    );
    if (!ok) this.counters.releasesRefused++;
  }

  /** `p`, or a `code` error after `ms` (then `onTimeout` runs, to let go of what `p` holds). */
  protected withTimeout<T>(
    p: Promise<T>,
    ms: number,
    code: ErrorCode,
    what: string,
    onTimeout?: () => void,
  ): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const timer = this.env.setTimer(ms, () => {
        reject(new HandoffError(code, `${what}: no answer after ${ms} ms`));
        onTimeout?.();
      });
      p.then(
        (v) => {
          timer.cancel();
          resolve(v);
        },
        (e: unknown) => {
          timer.cancel();
          reject(e);
        },
      );
    });
  }

  stats(): TransferStats {
    return {
      ...this.counters,
      grantsIssued: this.grants.issued,
      grantsExpired: this.grants.expired,
      ...this.nic.stats(),
    };
  }

  /**
   * Close (in the simulator: kill). A backend and NIC that close synchronously (sim) are closed before
   * this returns, so nothing of the engine moves after the step that killed it.
   */
  close(): Promise<void> {
    if (this.closing !== null) return this.closing;
    this.closed = true;
    this.closing = (async () => {
      this.grants.clear();
      const transport = this.closeTransport();
      if (transport !== undefined) await transport;
      const nic = this.nic.close();
      if (nic !== undefined) await nic;
      for (const st of [...this.inflight.values()]) this.finish(st, 'PEER_UNAVAILABLE', 'engine closed');
      for (const ws of this.abortWaiters.values()) for (const w of ws) w();
      this.abortWaiters.clear();
    })();
    return this.closing;
  }
}
