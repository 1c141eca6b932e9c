/**
 * The tcp data plane of one NIC thread: a listener that serves peers (ServerConn) and outgoing
 * connections per peer (ClientConn): the first opened on the first work request, more ("lanes") for
 * READs of at least laneMinBytes, each reopened after a failure. Also the raw-socket baseline of
 * `handoff bench transfer`, run between the same two NIC threads.
 *
 * A laned READ is cut into parts of equal bytes (ranges.ts splitPacked), one per lane; it completes
 * when every part did. When one part fails, the others are aborted first (each acknowledging as
 * ClientConn.abort says), then the READ fails: nothing of it lands after it ended.
 *
 * A peer that went silent (a connection carrying work dropped by ClientConn's silence watch: a stopped
 * process, a host gone without a FIN) is marked hung: work requests to it fail at once (PEER_UNAVAILABLE)
 * instead of each waiting out the silence bound on a fresh connection, which stopped decode's step for
 * every request again and again. One probe connection waits for the peer's answer to its hello; the mark
 * ends when the peer answers it (the probe becomes its first connection) or a new handshake re-registers
 * the peer (setPeer).
 */
import net from 'node:net';
import { ServerConn } from './nic_tcp_conn.ts';
import { ClientConn } from './nic_tcp_client.ts';
import { RawBaseline, type RawConfig } from './nic_tcp_raw.ts';
import type { TcpPeer, WorkRequest } from '../nic/nic_messages.ts';
import type { NicContext } from '../nic/nic_worker.ts';
import type { ErrorCode } from '../../util/errors.ts';
import { sideBytes, sideOf, sortedBy, splitPacked } from '../core/ranges.ts';

const SERVER_CONNECTIONS_MAX = 256;
/** Data connections one peer may hold (it opens one per lane, at most 16): past it its oldest goes. */
export const PEER_CONNECTIONS_MAX = 32;
/** How long a drain waits for a connection whose peer does not read before it drops the connection. */
export const DRAIN_TIMEOUT_MS = 10_000;
/** A probe of a hung peer that was closed (refused, reset) is dialed again after this long. */
export const PROBE_REDIAL_MS = 250;

/** A peer that went silent: since when, and the connection waiting for its answer to a hello. */
interface HungPeer {
  sinceMs: number;
  probe: ClientConn | null;
  redial: ReturnType<typeof setTimeout> | null;
}

export class TcpPlane {
  private readonly server: net.Server;
  private readonly peers = new Map<string, TcpPeer>();
  /** Connections to each peer: lane 0 carries everything but the other parts of laned READs. */
  private readonly clients = new Map<string, ClientConn[]>();
  /** Connections that carry no new request (ClientConn.retire): they finish theirs, then close. */
  private readonly retired = new Set<ClientConn>();
  /** Laned READs in flight: parts still to complete, and whether one failed (the rest being aborted). */
  private readonly laned = new Map<number, { left: number; failing: boolean }>();
  private readonly serverConns = new Set<ServerConn>();
  private readonly raw: RawBaseline;
  /** Peers that went silent with work in flight: no work is posted to them until they answer a hello. */
  private readonly hung = new Map<string, HungPeer>();

  constructor(
    private readonly ctx: NicContext,
    private readonly host: string,
    private readonly port: number,
  ) {
    this.raw = new RawBaseline(ctx.slabs, host);
    this.server = net.createServer((socket) => {
      if (this.serverConns.size >= SERVER_CONNECTIONS_MAX && !this.evictUngreeted()) {
        socket.destroy();
        return;
      }
      const conn: ServerConn = new ServerConn(
        socket,
        ctx,
        () => this.serverConns.delete(conn),
        (c) => this.capPeer(c),
      );
      this.serverConns.add(conn);
    });
  }

  /**
   * Full: the oldest connection that has not said hello yet gives its slot to the newcomer, so idle
   * sockets (no session needed to open them) cannot lock real peers out. False when every one did.
   */
  private evictUngreeted(): boolean {
    for (const c of this.serverConns) {
      if (c.peerEngineId !== null) continue;
      this.serverConns.delete(c);
      c.destroy('UNAUTHORIZED', 'no hello before the connection slots filled');
      return true;
    }
    return false;
  }

  /** A peer past PEER_CONNECTIONS_MAX data connections loses its oldest: one peer cannot fill the port. */
  private capPeer(conn: ServerConn): void {
    const mine = [...this.serverConns].filter((c) => c.peerEngineId === conn.peerEngineId);
    if (mine.length <= PEER_CONNECTIONS_MAX) return;
    const oldest = mine[0] as ServerConn;
    this.serverConns.delete(oldest);
    oldest.destroy('PEER_UNAVAILABLE', `more than ${PEER_CONNECTIONS_MAX} data connections from ${conn.peerEngineId}`);
  }

  listen(): Promise<number> {
    return new Promise((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(this.port, this.host, () => resolve((this.server.address() as net.AddressInfo).port));
    });
  }

  /**
   * A new address drops the connections to the old one. A new session alone does not: every handshake
   * (a refresh with the same peer) brings one, and the connections open already are authenticated, so
   * dropping them failed other requests' work in flight to that peer. New connections present it.
   */
  setPeer(peerEngineId: string, peer: TcpPeer): void {
    const old = this.peers.get(peerEngineId);
    this.peers.set(peerEngineId, peer);
    // A handshake went through: the peer's process answers again.
    this.endHung(peerEngineId);
    if (old && (old.host !== peer.host || old.port !== peer.port)) {
      for (const c of [...(this.clients.get(peerEngineId) ?? []), ...this.retired])
        if (c.peerEngineId === peerEngineId) c.destroy('PEER_UNAVAILABLE', `peer ${peerEngineId} re-registered`);
    }
  }

  /** The peer is gone (its last side channel closed): its connections both ways go with it. */
  removePeer(peerEngineId: string): void {
    this.peers.delete(peerEngineId);
    this.endHung(peerEngineId);
    for (const c of [...this.retired])
      if (c.peerEngineId === peerEngineId) c.destroy('PEER_UNAVAILABLE', `peer ${peerEngineId} is gone`);
    for (const c of this.clients.get(peerEngineId) ?? []) c.destroy('PEER_UNAVAILABLE', `peer ${peerEngineId} is gone`);
    for (const c of this.serverConns)
      if (c.peerEngineId === peerEngineId) c.destroy('PEER_UNAVAILABLE', `peer ${peerEngineId} is gone`);
  }

  post(wr: WorkRequest): void {
    const peer = this.peers.get(wr.peerEngineId);
    if (peer === undefined) {
      this.ctx.complete(wr.wrId, 'PEER_UNAVAILABLE', `no handshake with peer ${wr.peerEngineId}`);
      return;
    }
    const hung = this.hung.get(wr.peerEngineId);
    if (hung !== undefined) {
      const ago = (performance.now() - hung.sinceMs).toFixed(0);
      const why = `peer ${wr.peerEngineId} went silent ${ago} ms ago with work in flight; no work is sent to it until it answers`;
      this.ctx.complete(wr.wrId, 'PEER_UNAVAILABLE', why);
      return;
    }
    const big = wr.kind === 'read' && sideBytes(sideOf(wr.ranges, 'local')) >= this.ctx.laneMinBytes;
    const parts = big && this.ctx.lanes > 1 ? splitPacked(sortedBy(wr.ranges, 'local'), this.ctx.lanes) : null;
    const conns = this.lanesTo(wr.peerEngineId, peer, parts?.length ?? 1);
    if (parts === null || parts.length === 1) return (conns[0] as ClientConn).post(wr);
    this.laned.set(wr.wrId, { left: parts.length, failing: false });
    parts.forEach((ranges, k) => (conns[k] as ClientConn).post({ ...wr, ranges }));
  }

  /** At least `n` live connections to the peer, lane 0 first. */
  private lanesTo(peerEngineId: string, peer: TcpPeer, n: number): ClientConn[] {
    const list = this.clients.get(peerEngineId) ?? [];
    while (list.length < n) list.push(this.dial(peerEngineId, peer));
    this.clients.set(peerEngineId, list);
    return list;
  }

  private dial(peerEngineId: string, peer: TcpPeer): ClientConn {
    return ClientConn.connect(
      this.ctx,
      peerEngineId,
      peer,
      (c) => {
        this.retired.delete(c);
        const now = this.clients.get(peerEngineId);
        const i = now?.indexOf(c) ?? -1;
        if (now !== undefined && i >= 0) now.splice(i, 1);
        // No entry left behind per peer that went away (engines restarting under new ids).
        if (now?.length === 0) this.clients.delete(peerEngineId);
        if (c.wentSilent) this.markHung(peerEngineId);
        else this.probeClosed(peerEngineId, c);
      },
      (wrId, code, message) => this.partDone(wrId, code, message),
    );
  }

  /** `peerEngineId` went silent with work in flight: refuse work to it, drop its other connections, probe it. */
  private markHung(peerEngineId: string): void {
    if (this.hung.has(peerEngineId) || !this.peers.has(peerEngineId)) return;
    this.hung.set(peerEngineId, { sinceMs: performance.now(), probe: null, redial: null });
    for (const c of [...(this.clients.get(peerEngineId) ?? [])])
      c.destroy('PEER_UNAVAILABLE', `peer ${peerEngineId} went silent with work in flight`);
    this.probe(peerEngineId);
  }

  /** Dial the hung peer and wait for its answer to our hello; that answer ends the mark. */
  private probe(peerEngineId: string): void {
    const h = this.hung.get(peerEngineId);
    const peer = this.peers.get(peerEngineId);
    if (h === undefined || peer === undefined) return;
    h.redial = null;
    const conn = this.dial(peerEngineId, peer);
    h.probe = conn;
    conn.onGreeted = (c) => {
      if (this.hung.get(peerEngineId)?.probe !== c) return;
      this.hung.delete(peerEngineId);
      const list = this.clients.get(peerEngineId) ?? [];
      list.unshift(c);
      this.clients.set(peerEngineId, list);
    };
  }

  /** A probe closed before the peer answered it (refused, reset): dial again a little later. */
  private probeClosed(peerEngineId: string, c: ClientConn): void {
    const h = this.hung.get(peerEngineId);
    if (h === undefined || h.probe !== c) return;
    h.probe = null;
    h.redial = setTimeout(() => this.probe(peerEngineId), PROBE_REDIAL_MS);
    h.redial.unref();
  }

  /** The mark ends without an answer (a handshake re-registered the peer, or it is gone): close the probe. */
  private endHung(peerEngineId: string): void {
    const h = this.hung.get(peerEngineId);
    if (h === undefined) return;
    this.hung.delete(peerEngineId);
    if (h.redial !== null) clearTimeout(h.redial);
    h.probe?.destroy('PEER_UNAVAILABLE', `probe of ${peerEngineId} no longer needed`);
  }

  /** A connection finished its part of `wrId` (the whole of it, unless laned). */
  private partDone(wrId: number, code: ErrorCode | null, message: string): void {
    const l = this.laned.get(wrId);
    if (l === undefined) return this.ctx.complete(wrId, code, message);
    if (l.failing) return;
    if (code === null) {
      if (--l.left > 0) return;
      this.laned.delete(wrId);
      return this.ctx.complete(wrId, null, '');
    }
    // One part failed: the others must stop writing before the READ ends. They were posted with it, so
    // no byte of theirs yet is no sign of a stalled link: their connections (and the other READs they
    // carry) stay.
    l.failing = true;
    this.abort(wrId, () => this.ctx.complete(wrId, code, message), false);
  }

  /**
   * Stop writing local memory for `wrId` (whichever connection carries it); `ack` runs once nothing more
   * is written for it (at once, unless the socket's next read is already aimed at its pages). A connection on which
   * nothing arrived since that READ was posted (a while ago: ClientConn.abort) is dropped: after a link cut
   * TCP can sit in retransmission backoff for tens of seconds once the link is back, and every later request
   * would wait behind it; the next work request opens a fresh connection instead. `dropStalled` false: none
   * is dropped for that (the other parts of a laned READ one of whose parts failed).
   */
  abort(wrId: number, ack: () => void, dropStalled = true): void {
    let waiting = 1;
    const settle = (): void => {
      if (--waiting > 0) return;
      this.laned.delete(wrId);
      ack();
    };
    for (const c of [...[...this.clients.values()].flat(), ...this.retired]) {
      const state = c.abort(wrId, dropStalled);
      if (state === 'stalled') {
        this.unlist(c);
        c.destroy(
          'PEER_UNAVAILABLE',
          `no data from ${c.peerEngineId} since READ ${wrId} was posted: connection dropped`,
        );
        continue;
      }
      // Later requests go on a fresh connection, not behind the rest of this one's aborted work.
      if (c.retiring && !this.retired.has(c)) {
        this.unlist(c);
        this.retired.add(c);
      }
      if (state === 'armed') {
        waiting++;
        c.whenDisarmed(settle);
      }
    }
    settle();
  }

  /** `c` carries no new request any more. */
  private unlist(c: ClientConn): void {
    const list = this.clients.get(c.peerEngineId);
    const i = list?.indexOf(c) ?? -1;
    if (list === undefined || i < 0) return;
    list.splice(i, 1);
    if (list.length === 0) this.clients.delete(c.peerEngineId);
  }

  /** `transferId`'s grant was revoked: WRITEs of it under way on any connection land nothing more. */
  revoked(transferId: string): void {
    for (const c of this.serverConns) c.revoked(transferId);
  }

  /**
   * Settles once no connection reads `transferId`'s pages any more (its grant is revoked: no new READ of
   * it is served): READ replies and WRITEs of it still queued are sent and flushed to the kernel first. A
   * connection still holding some after `timeoutMs` (a peer that stopped reading) is dropped. WRITEs of
   * it landing here stopped at the revoke that came before (revoked): nothing to wait for.
   */
  async drain(transferId: string, timeoutMs = DRAIN_TIMEOUT_MS): Promise<void> {
    const conns = [...this.serverConns, ...[...this.clients.values()].flat(), ...this.retired];
    await Promise.all(
      conns.map(async (c) => {
        let timer: ReturnType<typeof setTimeout> | undefined;
        const late = new Promise<'late'>((resolve) => (timer = setTimeout(() => resolve('late'), timeoutMs)));
        const r = await Promise.race([c.drained(transferId), late]);
        clearTimeout(timer);
        if (r === 'late') c.destroy('PEER_UNAVAILABLE', `transfer ${transferId} not drained in ${timeoutMs} ms`);
      }),
    );
  }

  async close(): Promise<void> {
    for (const id of [...this.hung.keys()]) this.endHung(id);
    for (const c of [...[...this.clients.values()].flat(), ...this.retired])
      c.destroy('PEER_UNAVAILABLE', 'the local NIC was closed');
    for (const c of this.serverConns) c.socket.destroy();
    await Promise.all([new Promise<void>((resolve) => this.server.close(() => resolve())), this.raw.close()]);
  }

  /** The raw-socket baseline (nic_tcp_raw.ts): listen for its receivers. */
  rawServe(): Promise<number> {
    return this.raw.serve();
  }

  /** The raw-socket baseline: receive `bytes` from a rawServe port into our slabs. */
  rawRecv(host: string, port: number, bytes: number, cfg: RawConfig): Promise<number> {
    return this.raw.recv(host, port, bytes, cfg);
  }
}
