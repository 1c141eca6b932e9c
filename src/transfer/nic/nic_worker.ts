/**
 * The NIC: a worker thread per engine that executes one-sided work requests against peers and
 * serves peers' requests from its own slabs, without the engine thread and without waiting for the
 * compute stream. It owns the grant table (the host posts grant/revoke commands) and checks every
 * incoming READ/WRITE there. Completions go to a shared completion queue (Atomics) and the host.
 *
 * Invariants: a work request completes exactly once; after it completes (or after an abort is
 * acknowledged) this NIC never touches local memory for it again.
 */
import { parentPort, receiveMessageOnPort, workerData, type MessagePort } from 'node:worker_threads';
import { assert } from '../../util/assert.ts';
import type { ErrorCode } from '../../util/errors.ts';
import { GrantTable, type GrantDecision } from '../core/grant_table.ts';
import { InprocLink } from '../inproc/nic_inproc.ts';
import {
  COUNTER,
  CQ_DONE,
  CQ_FAILED,
  CQ_INTS_PER_SLOT,
  errorCodeIndex,
  type NicCommand,
  type NicEvent,
  type NicInit,
  type WorkRequest,
} from './nic_messages.ts';
import { TcpPlane } from '../tcp/nic_tcp.ts';
import type { SideRanges } from '../core/ranges.ts';
import type { SlabLayout } from '../core/types.ts';

/** What links and the tcp plane need from the NIC. */
export interface NicContext {
  readonly engineId: string;
  readonly layout: SlabLayout;
  readonly slabs: Uint8Array[];
  readonly dataFrameBytes: number;
  /** tcp: READ segments at least this long are received straight into the slab. */
  readonly recvDirectMinBytes: number;
  /** tcp: receive READ payloads with readv into their pages when the native addon is built. */
  readonly scatterRecv: boolean;
  /** tcp: READs of at least laneMinBytes are cut over this many connections. */
  readonly lanes: number;
  readonly laneMinBytes: number;
  /**
   * tcp: a connection that carries work and moves not one byte either way for this long is dropped, its
   * requests failed (PEER_UNAVAILABLE): the peer hung (default SILENT_PEER_MS; tests set it).
   */
  readonly silentPeerMs?: number;
  /** The engine that may use `session` on our data port (after applying queued host commands). */
  sessionPeer(session: string): string | undefined;
  /**
   * Check a peer's request `reqId` against the grant table. Refusals are counted once per work request:
   * the lanes of one READ (parts with the same reqId) count as one.
   */
  checkGrant(peerEngineId: string, transferId: string, token: string, ranges: SideRanges, reqId: number): GrantDecision;
  /** Finish a work request (no-op when it already finished). */
  complete(wrId: number, code: ErrorCode | null, message: string): void;
  count(counter: number, n?: number): void;
  emit(ev: NicEvent): void;
}

const SESSIONS_PER_PEER_MAX = 4;
/** Refused work requests remembered, so the other lanes of one are not counted again (bounded). */
const REFUSED_REMEMBERED = 1024;

interface Pending {
  wr: WorkRequest;
  timer: NodeJS.Timeout | null;
}

function nowEpochMs(): number {
  return performance.timeOrigin + performance.now();
}

class Nic implements NicContext {
  readonly engineId: string;
  readonly layout: SlabLayout;
  readonly slabs: Uint8Array[];
  readonly dataFrameBytes: number;
  readonly recvDirectMinBytes: number;
  readonly scatterRecv: boolean;
  readonly lanes: number;
  readonly laneMinBytes: number;
  private readonly cq: Int32Array;
  private readonly counters: Int32Array;
  private readonly control: MessagePort;
  private readonly grants: GrantTable;
  private readonly sessions = new Map<string, string>();
  /** Sessions offered by our handshakes still under way (tcp.ts dial): promoted or withdrawn when each ends. */
  private readonly dialSessions = new Map<string, string>();
  private readonly refused = new Set<string>();
  private readonly pending = new Map<number, Pending>();
  private readonly links = new Map<string, InprocLink>();
  private readonly tcp: TcpPlane | null;
  private closed = false;

  constructor(init: NicInit) {
    this.engineId = init.engineId;
    this.layout = init.layout;
    this.slabs = init.slabs.map((b) => new Uint8Array(b));
    this.dataFrameBytes = init.dataFrameBytes;
    this.recvDirectMinBytes = init.recvDirectMinBytes;
    this.scatterRecv = init.scatterRecv;
    this.lanes = init.lanes;
    this.laneMinBytes = init.laneMinBytes;
    this.cq = new Int32Array(init.cq);
    this.counters = new Int32Array(init.counters);
    this.control = init.control;
    this.grants = new GrantTable(init.layout);
    this.tcp = init.kind === 'tcp' ? new TcpPlane(this, init.listenHost, init.dataPort) : null;
    this.control.on('message', (cmd: NicCommand) => this.apply(cmd));
  }

  async listen(): Promise<void> {
    const dataPort = this.tcp ? await this.tcp.listen() : 0;
    this.emit({ t: 'ready', dataPort });
  }

  emit(ev: NicEvent): void {
    parentPort?.postMessage(ev);
  }

  count(counter: number, n = 1): void {
    Atomics.add(this.counters, counter, n);
  }

  /** Apply every command the host has posted so far (grants issued before a token left the host). */
  private drain(): void {
    for (;;) {
      const m = receiveMessageOnPort(this.control);
      if (m === undefined) return;
      this.apply(m.message as NicCommand);
    }
  }

  sessionPeer(session: string): string | undefined {
    this.drain();
    return this.sessions.get(session) ?? this.dialSessions.get(session);
  }

  checkGrant(
    peerEngineId: string,
    transferId: string,
    token: string,
    ranges: SideRanges,
    reqId: number,
  ): GrantDecision {
    this.drain();
    const d = this.grants.check({ peerEngineId, transferId, token, ranges, nowMs: nowEpochMs() });
    if (!d.ok) {
      const key = `${peerEngineId}\n${reqId}`;
      if (!this.refused.has(key)) this.count(COUNTER.grantsRefused);
      this.refused.add(key);
      if (this.refused.size > REFUSED_REMEMBERED) this.refused.delete(this.refused.values().next().value as string);
    }
    return d;
  }

  complete(wrId: number, code: ErrorCode | null, message: string): void {
    const p = this.pending.get(wrId);
    if (p === undefined) return;
    this.pending.delete(wrId);
    if (p.timer !== null) clearTimeout(p.timer);
    const base = p.wr.slot * CQ_INTS_PER_SLOT;
    Atomics.store(this.cq, base + 1, code === null ? 0 : errorCodeIndex(code));
    Atomics.store(this.cq, base, code === null ? CQ_DONE : CQ_FAILED);
    Atomics.notify(this.cq, base);
    this.emit({ t: 'cq', wrId, code, message });
  }

  private apply(cmd: NicCommand): void {
    if (this.closed) return;
    switch (cmd.t) {
      case 'grant':
        if (this.grants.size > 60000) this.grants.sweep(nowEpochMs());
        this.grants.add({ ...cmd, expiresAtMs: cmd.expiresAtEpochMs });
        return;
      case 'revoke':
        this.grants.revoke(cmd.transferId);
        this.tcp?.revoked(cmd.transferId);
        return;
      case 'drain':
        // inproc copies a served READ or WRITE in one go on this thread: none runs now. tcp sends from the
        // pages until the kernel took the bytes.
        void (this.tcp?.drain(cmd.transferId) ?? Promise.resolve()).then(() => this.emit({ t: 'drained', id: cmd.id }));
        return;
      case 'session':
        if (cmd.dialing === true) this.dialSessions.set(cmd.session, cmd.peerEngineId);
        else {
          this.dialSessions.delete(cmd.session);
          this.addSession(cmd.session, cmd.peerEngineId);
        }
        return;
      case 'unsession':
        this.sessions.delete(cmd.session);
        this.dialSessions.delete(cmd.session);
        return;
      case 'peer':
        this.addPeer(cmd);
        return;
      case 'unpeer':
        this.links.get(cmd.peerEngineId)?.close(`peer ${cmd.peerEngineId} is gone`);
        this.links.delete(cmd.peerEngineId);
        this.tcp?.removePeer(cmd.peerEngineId);
        for (const [s, peer] of this.sessions) if (peer === cmd.peerEngineId) this.sessions.delete(s);
        return;
      case 'post':
        this.post(cmd.wr);
        return;
      case 'abort':
        this.abort(cmd.wrId);
        return;
      case 'rawServe':
        assert(this.tcp !== null, 'rawServe needs the tcp backend');
        void this.tcp.rawServe().then((port) => this.emit({ t: 'rawPort', port }));
        return;
      case 'rawRecv':
        assert(this.tcp !== null, 'rawRecv needs the tcp backend');
        void this.tcp
          .rawRecv(cmd.host, cmd.port, cmd.bytes, cmd.cfg)
          .then((bytes) => this.emit({ t: 'rawDone', bytes }));
        return;
      case 'rawCopy': {
        const link = this.links.get(cmd.peerEngineId);
        assert(link !== undefined, `rawCopy: no inproc link to ${cmd.peerEngineId}`);
        this.emit({ t: 'rawCopied', ms: link.rawCopyMs(cmd.ranges) });
        return;
      }
      case 'close':
        void this.close();
        return;
    }
  }

  /** Bounded: a peer that handshakes again and again keeps only its newest few sessions. */
  private addSession(session: string, peerEngineId: string): void {
    this.sessions.set(session, peerEngineId);
    const mine = [...this.sessions].filter(([, p]) => p === peerEngineId);
    for (const [old] of mine.slice(0, Math.max(0, mine.length - SESSIONS_PER_PEER_MAX))) this.sessions.delete(old);
  }

  private addPeer(cmd: Extract<NicCommand, { t: 'peer' }>): void {
    if (cmd.inproc) {
      this.links.get(cmd.peerEngineId)?.close(`link to ${cmd.peerEngineId} replaced`);
      const { port, slabs, direct } = cmd.inproc;
      const link = new InprocLink(this, cmd.peerEngineId, port, slabs, direct);
      this.links.set(cmd.peerEngineId, link);
      link.onClose(() => {
        if (this.links.get(cmd.peerEngineId) === link) this.links.delete(cmd.peerEngineId);
      });
    }
    if (cmd.tcp) this.tcp?.setPeer(cmd.peerEngineId, cmd.tcp);
  }

  private post(wr: WorkRequest): void {
    assert(!this.pending.has(wr.wrId), `work request ${wr.wrId} posted twice`);
    const p: Pending = { wr, timer: null };
    this.pending.set(wr.wrId, p);
    if (wr.delayMs > 0) p.timer = setTimeout(() => this.start(p), wr.delayMs);
    else this.start(p);
  }

  private start(p: Pending): void {
    p.timer = null;
    const { wr } = p;
    if (wr.failWith !== null) {
      this.complete(wr.wrId, wr.failWith, `injected fault: ${wr.kind} of transfer ${wr.transferId} failed`);
      return;
    }
    const link = this.links.get(wr.peerEngineId);
    if (link) link.post(wr);
    else if (this.tcp) this.tcp.post(wr);
    else this.complete(wr.wrId, 'PEER_UNAVAILABLE', `no link to peer ${wr.peerEngineId}`);
  }

  private abort(wrId: number): void {
    const p = this.pending.get(wrId);
    const ack = (): void => {
      this.complete(wrId, 'REQUEST_ABORTED', `work request ${wrId} aborted`);
      this.emit({ t: 'aborted', wrId });
    };
    if (p === undefined || p.timer !== null) return ack();
    const link = this.links.get(p.wr.peerEngineId);
    if (link) link.abort(wrId, ack);
    else if (this.tcp) this.tcp.abort(wrId, ack);
    else ack();
  }

  private async close(): Promise<void> {
    this.drain();
    this.closed = true;
    for (const link of this.links.values()) link.close('NIC closed');
    this.links.clear();
    if (this.tcp) await this.tcp.close();
    for (const wrId of [...this.pending.keys()]) this.complete(wrId, 'PEER_UNAVAILABLE', 'the local NIC was closed');
    this.control.close();
    this.emit({ t: 'closed' });
  }
}

const nic = new Nic(workerData as NicInit);
await nic.listen();
