/**
 * The tcp data plane of one NIC thread: a listener that serves peers (ServerConn) and one outgoing
 * connection per peer (ClientConn), opened on the first work request and reopened after a failure.
 * Also the raw-socket baseline of `handoff bench transfer`, run between the same two NIC threads.
 */
import net from 'node:net';
import { ServerConn } from './nic_tcp_conn.ts';
import { ClientConn } from './nic_tcp_client.ts';
import { RawBaseline, type RawConfig } from './nic_tcp_raw.ts';
import type { TcpPeer, WorkRequest } from '../nic/nic_messages.ts';
import type { NicContext } from '../nic/nic_worker.ts';

const SERVER_CONNECTIONS_MAX = 256;

export class TcpPlane {
  private readonly server: net.Server;
  private readonly peers = new Map<string, TcpPeer>();
  private readonly clients = new Map<string, ClientConn>();
  private readonly serverConns = new Set<ServerConn>();
  private readonly raw: RawBaseline;

  constructor(
    private readonly ctx: NicContext,
    private readonly host: string,
    private readonly port: number,
  ) {
    this.raw = new RawBaseline(ctx.slabs, host);
    this.server = net.createServer((socket) => {
      if (this.serverConns.size >= SERVER_CONNECTIONS_MAX) {
        socket.destroy();
        return;
      }
      const conn: ServerConn = new ServerConn(socket, ctx, () => this.serverConns.delete(conn));
      this.serverConns.add(conn);
    });
  }

  listen(): Promise<number> {
    return new Promise((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(this.port, this.host, () => resolve((this.server.address() as net.AddressInfo).port));
    });
  }

  setPeer(peerEngineId: string, peer: TcpPeer): void {
    const old = this.peers.get(peerEngineId);
    this.peers.set(peerEngineId, peer);
    const conn = this.clients.get(peerEngineId);
    if (old && conn && (old.host !== peer.host || old.port !== peer.port || old.session !== peer.session)) {
      conn.destroy('PEER_UNAVAILABLE', `peer ${peerEngineId} re-registered`);
    }
  }

  removePeer(peerEngineId: string): void {
    this.peers.delete(peerEngineId);
    this.clients.get(peerEngineId)?.destroy('PEER_UNAVAILABLE', `peer ${peerEngineId} is gone`);
  }

  post(wr: WorkRequest): void {
    const peer = this.peers.get(wr.peerEngineId);
    if (peer === undefined) {
      this.ctx.complete(wr.wrId, 'PEER_UNAVAILABLE', `no handshake with peer ${wr.peerEngineId}`);
      return;
    }
    let conn = this.clients.get(wr.peerEngineId);
    if (conn === undefined) {
      conn = ClientConn.connect(this.ctx, wr.peerEngineId, peer, (c) => {
        if (this.clients.get(c.peerEngineId) === c) this.clients.delete(c.peerEngineId);
      });
      this.clients.set(wr.peerEngineId, conn);
    }
    conn.post(wr);
  }

  /**
   * Stop writing local memory for `wrId` (whichever connection carries it); `ack` runs once nothing more
   * is written for it (at once, unless the socket's next read is already aimed at its pages). A connection on which
   * nothing arrived since that READ was posted is dropped: after a link cut TCP can sit in
   * retransmission backoff for tens of seconds once the link is back, and every later request would
   * wait behind it; the next work request opens a fresh connection instead.
   */
  abort(wrId: number, ack: () => void): void {
    let waiting = 1;
    const settle = (): void => {
      if (--waiting === 0) ack();
    };
    for (const [peerEngineId, c] of [...this.clients]) {
      const state = c.abort(wrId);
      if (state === 'armed') {
        waiting++;
        c.whenDisarmed(settle);
      } else if (state === 'stalled') {
        this.clients.delete(peerEngineId);
        c.destroy('PEER_UNAVAILABLE', `no data from ${peerEngineId} since READ ${wrId} was posted: connection dropped`);
      }
    }
    settle();
  }

  async close(): Promise<void> {
    for (const c of this.clients.values()) c.destroy('PEER_UNAVAILABLE', 'the local NIC was closed');
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
