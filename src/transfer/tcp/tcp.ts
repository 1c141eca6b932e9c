/**
 * tcp backend. Two listeners per engine, both on `host` (127.0.0.1 by default):
 *   - side channel (this thread, `port`): handshake and notifications (tcp_side_channel.ts);
 *   - data plane (the NIC thread, `dataPort`): READ/WRITE frames answered straight from the slabs,
 *     grant checks in that thread (nic_tcp.ts). The engine thread is never on the data path.
 * The data port is announced in the handshake together with a per-peer session token; a data
 * connection without a valid session is closed, so the data plane is only reachable through a
 * handshake (and hence through the shared secret, when one is set).
 */
import net from 'node:net';
import { assert, rethrowIfAssertion } from '../../util/assert.ts';
import { HandoffError, listenFailed } from '../../util/errors.ts';
import { hexId } from '../../util/ids.ts';
import { compatibilityProblem } from '../core/metadata.ts';
import { NicHost } from '../nic/nic_host.ts';
import { SideConn, proof, proofMatches, type SideMessage } from './tcp_side_channel.ts';
import { TransferEngineCore } from '../core/transfer_engine.ts';
import type { EngineMetadata, Notification, PeerAddress, TransferEngineOptions } from '../core/types.ts';
import type { RawConfig } from './nic_tcp_raw.ts';

const SIDE_CONNECTIONS_MAX = 256;

function isWildcard(host: string): boolean {
  return host === '0.0.0.0' || host === '::' || host === '';
}

/** A peer's data plane as it announces it in every handshake (its bind host and data port). */
function announced(m: { dataHost: string; dataPort: number }): string {
  return `${m.dataHost}:${m.dataPort}`;
}

export class TcpTransferEngine extends TransferEngineCore<NicHost> {
  readonly backend = 'tcp' as const;
  private readonly server: net.Server;
  private readonly bindHost: string;
  private sidePort = 0;
  private readonly conns = new Map<string, SideConn>();
  private readonly allConns = new Set<SideConn>();
  /** Accepted connections whose handshake has not completed, oldest first. */
  private readonly unwelcomed = new Set<SideConn>();
  private readonly byAddress = new Map<string, string>();
  /** Where each peer with a side channel says its data plane is (announced). */
  private readonly dataAddrs = new Map<string, string>();

  private constructor(opts: TransferEngineOptions, nic: NicHost) {
    super(opts, nic);
    this.bindHost = opts.host ?? '127.0.0.1';
    this.server = net.createServer((socket) => this.accept(socket));
  }

  static async create(opts: TransferEngineOptions): Promise<TcpTransferEngine> {
    const host = opts.host ?? '127.0.0.1';
    const nic = await NicHost.start({
      kind: 'tcp',
      engineId: opts.engineId,
      layout: opts.layout,
      slabs: opts.slabs,
      slotsMax: opts.inflightMax ?? 1024,
      listenHost: host,
      dataPort: opts.dataPort ?? 0,
      dataFrameBytes: opts.dataFrameBytes ?? 4 << 20,
      recvDirectMinBytes: opts.recvDirectMinBytes ?? 64 << 10,
      scatterRecv: opts.scatterRecv ?? true,
      lanes: opts.lanes ?? 1,
      laneMinBytes: opts.laneMinBytes ?? 8 << 20,
    });
    const engine = new TcpTransferEngine(opts, nic);
    try {
      engine.sidePort = await new Promise<number>((resolve, reject) => {
        engine.server.once('error', reject);
        engine.server.listen(opts.port ?? 0, host, () => resolve((engine.server.address() as net.AddressInfo).port));
      });
    } catch (e) {
      rethrowIfAssertion(e);
      await nic.close();
      throw listenFailed(e, host, opts.port ?? 0, 'KV side-channel');
    }
    return engine;
  }

  address(): PeerAddress {
    return { host: isWildcard(this.bindHost) ? '127.0.0.1' : this.bindHost, port: this.sidePort };
  }

  ports(): { sideChannel: number; data: number } {
    return { sideChannel: this.sidePort, data: this.nic.dataPort };
  }

  // ---- listener side ----

  private accept(socket: net.Socket): void {
    if (this.isClosed || (this.allConns.size >= SIDE_CONNECTIONS_MAX && !this.evictUnwelcomed())) {
      socket.destroy();
      return;
    }
    const nonce = hexId(this.env, 16);
    const timer = this.env.setTimer(this.handshakeTimeoutMs, () => {
      if (conn.peerEngineId === null) conn.close();
    });
    const conn = this.track(
      new SideConn(
        socket,
        (c, m) => this.onListenerMessage(c, m, nonce),
        (c) => {
          timer.cancel();
          this.unwelcomed.delete(c);
          this.untrack(c);
        },
      ),
    );
    this.unwelcomed.add(conn);
    conn.send({ m: 'challenge', nonce, engineId: this.engineId });
  }

  /**
   * Full: the oldest accepted connection still without a handshake gives its slot to the newcomer, so
   * idle sockets (no secret needed to open them) cannot lock real peers out. False when there is none.
   */
  private evictUnwelcomed(): boolean {
    const oldest = this.unwelcomed.values().next();
    if (oldest.done === true) return false;
    const conn = oldest.value;
    this.unwelcomed.delete(conn);
    this.counters.handshakesRefused++;
    conn.close();
    this.untrack(conn);
    return true;
  }

  private onListenerMessage(conn: SideConn, msg: SideMessage, nonce: string): void {
    if (conn.peerEngineId !== null) return this.onPeerMessage(conn, msg);
    if (msg.m !== 'hello') return conn.close();
    const remote = msg.meta as EngineMetadata;
    if (this.secret !== undefined && !proofMatches(this.secret, 'client', nonce, remote.engineId, msg.proof)) {
      this.counters.handshakesRefused++;
      return conn.refuse('UNAUTHORIZED', `handshake refused by ${this.engineId}: side channel secret missing or wrong`);
    }
    const problem = compatibilityProblem(this.metadata, remote);
    if (problem !== null) {
      this.counters.handshakesRefused++;
      return conn.refuse('PEER_INCOMPATIBLE', problem);
    }
    const clash = this.identityClash(remote.engineId, announced(msg));
    if (clash !== null) {
      this.counters.handshakesRefused++;
      return conn.refuse('PEER_INCOMPATIBLE', clash);
    }
    const session = hexId(this.env, 16);
    this.nic.send({ t: 'session', session, peerEngineId: remote.engineId });
    const dataHost = isWildcard(msg.dataHost) ? (conn.socket.remoteAddress ?? '127.0.0.1') : msg.dataHost;
    this.nic.send({
      t: 'peer',
      peerEngineId: remote.engineId,
      tcp: { host: dataHost, port: msg.dataPort, session: msg.session },
    });
    this.unwelcomed.delete(conn);
    this.adopt(conn, remote, announced(msg));
    conn.send({
      m: 'welcome',
      meta: this.metadata,
      proof: this.secret === undefined ? '' : proof(this.secret, 'server', msg.nonce, this.engineId),
      dataHost: this.bindHost,
      dataPort: this.nic.dataPort,
      session,
    });
  }

  // ---- dialer side ----

  protected async handshakeImpl(peer: PeerAddress, abandoned: AbortSignal): Promise<EngineMetadata> {
    const key = `${peer.host}:${peer.port}`;
    const known = this.byAddress.get(key);
    const previous = known === undefined ? undefined : this.conns.get(known);
    if (known !== undefined && peer.fresh !== true) {
      const meta = this.peers.get(known);
      if (previous && !previous.isClosed && meta) return meta;
    }
    const meta = await this.dial(peer, abandoned);
    this.byAddress.set(key, meta.engineId);
    // A refresh answered by the same engine replaces its side channel: the old one would stay open on both
    // sides, one more per refresh, until the peer's listener refused every new one (SIDE_CONNECTIONS_MAX).
    if (previous !== undefined && meta.engineId === known && this.conns.get(known) !== previous) previous.retire();
    return meta;
  }

  /** Answers the listener's challenge: registers our data session with the NIC and sends the hello. */
  private sendHello(
    conn: SideConn,
    challenge: { nonce: string; engineId: string },
    myNonce: string,
    mySession: string,
  ): void {
    // Usable at once (the listener may connect as soon as it welcomed us), but it takes none of the
    // challenger's session slots before the welcome passed: a listener claiming another engine's id could
    // otherwise push that engine's sessions out (completeDial promotes it).
    this.nic.send({ t: 'session', session: mySession, peerEngineId: challenge.engineId, dialing: true });
    conn.send({
      m: 'hello',
      meta: this.metadata,
      proof: this.secret === undefined ? '' : proof(this.secret, 'client', challenge.nonce, this.engineId),
      nonce: myNonce,
      dataHost: this.bindHost,
      dataPort: this.nic.dataPort,
      session: mySession,
    });
  }

  /** The listener's answer to our hello: its welcome, or why the handshake fails. */
  private checkWelcome(
    peer: PeerAddress,
    challengerId: string,
    myNonce: string,
    msg: SideMessage,
  ): Extract<SideMessage, { m: 'welcome' }> | HandoffError {
    if (msg.m === 'refuse') {
      const code = msg.code === 'UNAUTHORIZED' || msg.code === 'PEER_INCOMPATIBLE' ? msg.code : 'PEER_UNAVAILABLE';
      return new HandoffError(code, `${challengerId} refused the handshake: ${msg.message}`);
    }
    if (msg.m !== 'welcome' || msg.meta.engineId !== challengerId) {
      return new HandoffError('PEER_UNAVAILABLE', `${peer.host}:${peer.port} broke the handshake protocol`);
    }
    if (this.secret !== undefined && !proofMatches(this.secret, 'server', myNonce, msg.meta.engineId, msg.proof)) {
      return new HandoffError('UNAUTHORIZED', `${msg.meta.engineId} did not prove the side channel secret`);
    }
    const problem = compatibilityProblem(this.metadata, msg.meta as EngineMetadata);
    if (problem !== null) return new HandoffError('PEER_INCOMPATIBLE', problem);
    const clash = this.identityClash(msg.meta.engineId, announced(msg));
    if (clash !== null) return new HandoffError('PEER_INCOMPATIBLE', clash);
    return msg;
  }

  /** Tells the NIC where the welcomed peer's data plane is and adopts the connection; returns its metadata. */
  private completeDial(
    conn: SideConn,
    peer: PeerAddress,
    welcome: Extract<SideMessage, { m: 'welcome' }>,
    mySession: string,
  ): EngineMetadata {
    const remote = welcome.meta as EngineMetadata;
    this.nic.send({ t: 'session', session: mySession, peerEngineId: remote.engineId });
    const dataHost = isWildcard(welcome.dataHost) ? peer.host : welcome.dataHost;
    this.nic.send({
      t: 'peer',
      peerEngineId: remote.engineId,
      tcp: { host: dataHost, port: welcome.dataPort, session: welcome.session },
    });
    this.adopt(conn, remote, announced(welcome));
    return remote;
  }

  /** Invariant: a dial that does not end in a handshake closes its socket (failure, refusal or `abandoned`). */
  private dial(peer: PeerAddress, abandoned: AbortSignal): Promise<EngineMetadata> {
    return new Promise<EngineMetadata>((resolve, reject) => {
      let challenge: { nonce: string; engineId: string } | null = null;
      const myNonce = hexId(this.env, 16);
      const mySession = hexId(this.env, 16);
      let settled = false;
      const fail = (e: HandoffError, conn: SideConn): void => {
        if (settled) return;
        settled = true;
        abandoned.removeEventListener('abort', onAbandoned);
        conn.close();
        // Our hello offered the session (sendHello registered it): a listener that failed the handshake
        // (no proof of the secret, incompatible, gone) must not be able to present it on our data port.
        if (challenge !== null) this.nic.send({ t: 'unsession', session: mySession });
        reject(e);
      };
      const onAbandoned = (): void =>
        fail(new HandoffError('PEER_UNAVAILABLE', `handshake with ${peer.host}:${peer.port} abandoned`), conn);
      const onMessage = (conn: SideConn, msg: SideMessage): void => {
        if (settled) return this.onPeerMessage(conn, msg);
        if (challenge === null) {
          if (msg.m !== 'challenge')
            return fail(
              new HandoffError('PEER_UNAVAILABLE', `${peer.host}:${peer.port} did not send a challenge`),
              conn,
            );
          challenge = { nonce: msg.nonce, engineId: msg.engineId };
          this.sendHello(conn, challenge, myNonce, mySession);
          return;
        }
        const welcome = this.checkWelcome(peer, challenge.engineId, myNonce, msg);
        if (welcome instanceof HandoffError) return fail(welcome, conn);
        const remote = this.completeDial(conn, peer, welcome, mySession);
        settled = true;
        abandoned.removeEventListener('abort', onAbandoned);
        resolve(remote);
      };
      const socket = net.connect({ host: peer.host, port: peer.port });
      const conn = this.track(
        new SideConn(socket, onMessage, (c) => {
          this.untrack(c);
          if (!settled)
            fail(
              new HandoffError(
                'PEER_UNAVAILABLE',
                `side channel to ${peer.host}:${peer.port} closed during the handshake`,
              ),
              c,
            );
        }),
      );
      assert(conn.peerEngineId === null, 'fresh connection has no peer');
      if (abandoned.aborted) onAbandoned();
      else abandoned.addEventListener('abort', onAbandoned, { once: true });
    });
  }

  // ---- after the handshake, both directions ----

  private onPeerMessage(conn: SideConn, msg: SideMessage): void {
    const from = conn.peerEngineId;
    if (from === null || msg.m !== 'notify') return conn.close();
    conn.send({ m: 'ack', seq: msg.seq });
    this.deliver(from, msg.n as Notification);
  }

  /**
   * Why a handshake naming `engineId` announcing its data plane at `dataAddr` is refused: a live side channel
   * to that engine announced another one (an impostor on another port, or two engines sharing an
   * id). Taking the id over would point the NIC at the newcomer: other requests' READs and WRITEs of that
   * engine would go to it. Null when admitted (a first handshake, or the same engine handshaking again).
   */
  private identityClash(engineId: string, dataAddr: string): string | null {
    const known = this.dataAddrs.get(engineId);
    if (known === undefined || known === dataAddr) return null;
    if (![...this.allConns].some((c) => c.peerEngineId === engineId && !c.isClosed)) return null;
    return `engine id ${engineId} is already connected here with its data plane at ${known}, not ${dataAddr}`;
  }

  private adopt(conn: SideConn, remote: EngineMetadata, dataAddr: string): void {
    this.dataAddrs.set(remote.engineId, dataAddr);
    conn.peerEngineId = remote.engineId;
    this.conns.set(remote.engineId, conn);
    this.peers.set(remote.engineId, remote);
  }

  private track(conn: SideConn): SideConn {
    this.allConns.add(conn);
    return conn;
  }

  /**
   * The side channel is the liveness signal: when the last one to a peer closes, the peer is gone;
   * its work requests fail with PEER_UNAVAILABLE and a new handshake is needed.
   */
  private untrack(conn: SideConn): void {
    this.allConns.delete(conn);
    const peer = conn.peerEngineId;
    if (peer === null) return;
    if (this.conns.get(peer) === conn) this.conns.delete(peer);
    const other = [...this.allConns].find((c) => c.peerEngineId === peer && !c.isClosed);
    if (other !== undefined) {
      this.conns.set(peer, other);
      return;
    }
    if (this.isClosed) return;
    this.peers.delete(peer);
    this.dataAddrs.delete(peer);
    for (const [addr, id] of this.byAddress) if (id === peer) this.byAddress.delete(addr);
    this.nic.send({ t: 'unpeer', peerEngineId: peer });
  }

  protected override sideChannelStalled(peerEngineId: string): void {
    this.log.warn(
      { peer: peerEngineId },
      'side channel silent past the notify timeout: closing it; the next use handshakes again',
    );
    for (const c of [...this.allConns]) if (c.peerEngineId === peerEngineId) c.close();
  }

  protected sendNotification(peerEngineId: string, n: Notification): Promise<void> {
    const conn = this.conns.get(peerEngineId);
    if (conn === undefined || conn.isClosed)
      return Promise.reject(new HandoffError('PEER_UNAVAILABLE', `no side channel to ${peerEngineId}`));
    return conn.notify(n);
  }

  protected async closeTransport(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const c of this.allConns) c.close();
    await closed;
  }

  /**
   * Bench baseline: ms to stream `bytes` over plain sockets from `from`'s NIC thread into our slabs
   * (nic_tcp_raw.ts). Its connections stay open between runs, as the backend's data connection does.
   */
  async rawStreamMs(from: TcpTransferEngine, bytes: number, cfg: RawConfig): Promise<number> {
    const port = await from.nic.request({ t: 'rawServe' }, (ev) => (ev.t === 'rawPort' ? ev.port : undefined));
    const t0 = this.env.nowMs();
    const got = await this.nic.request({ t: 'rawRecv', host: from.address().host, port, bytes, cfg }, (ev) =>
      ev.t === 'rawDone' ? ev.bytes : undefined,
    );
    assert(got === bytes, `raw baseline moved ${got} of ${bytes} bytes`);
    return this.env.nowMs() - t0;
  }
}
