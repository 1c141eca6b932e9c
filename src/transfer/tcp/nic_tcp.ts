/**
 * The tcp data plane of one NIC thread: a listener that serves peers (ServerConn) and one outgoing
 * connection per peer (ClientConn), opened on the first work request and reopened after a failure.
 * Also the raw-socket baseline of `handoff bench transfer`, run between the same two NIC threads.
 */
import net from 'node:net';
import { ClientConn, RECV_BUFFER_BYTES, SEND_HIGH_WATER, ServerConn } from './nic_tcp_conn.ts';
import type { TcpPeer, WorkRequest } from '../nic/nic_messages.ts';
import type { NicContext } from '../nic/nic_worker.ts';

const SERVER_CONNECTIONS_MAX = 256;

export class TcpPlane {
  private readonly server: net.Server;
  private readonly peers = new Map<string, TcpPeer>();
  private readonly clients = new Map<string, ClientConn>();
  private readonly serverConns = new Set<ServerConn>();
  private readonly rawSockets = new Set<net.Socket>();
  private rawServer: net.Server | null = null;

  constructor(
    private readonly ctx: NicContext,
    private readonly host: string,
    private readonly port: number,
  ) {
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
   * Stop writing local memory for `wrId` (whichever connection carries it). A connection on which
   * nothing arrived since that READ was posted is dropped: after a link cut TCP can sit in
   * retransmission backoff for tens of seconds once the link is back, and every later request would
   * wait behind it; the next work request opens a fresh connection instead.
   */
  abort(wrId: number): void {
    for (const [peerEngineId, c] of [...this.clients]) {
      if (!c.abort(wrId)) continue;
      this.clients.delete(peerEngineId);
      c.destroy('PEER_UNAVAILABLE', `no data from ${peerEngineId} since READ ${wrId} was posted: connection dropped`);
    }
  }

  async close(): Promise<void> {
    for (const c of this.clients.values()) c.destroy('PEER_UNAVAILABLE', 'the local NIC was closed');
    for (const c of this.serverConns) c.socket.destroy();
    for (const s of this.rawSockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
    if (this.rawServer) await new Promise<void>((resolve) => this.rawServer?.close(() => resolve()));
  }

  /** Baseline server: on each connection read `count u64 | chunk u32`, then stream count bytes of slab 0. */
  rawServe(): Promise<number> {
    const existing = this.rawServer?.address();
    if (existing && typeof existing === 'object') return Promise.resolve(existing.port);
    const server = net.createServer((socket) => {
      this.rawSockets.add(socket);
      socket.on('close', () => this.rawSockets.delete(socket));
      socket.on('error', () => {});
      socket.once('data', (req: Buffer) => {
        if (req.length < 12) return void socket.destroy();
        const count = req.readUInt32BE(0) * 0x1_0000_0000 + req.readUInt32BE(4);
        const chunk = req.readUInt32BE(8);
        this.rawSend(socket, count, chunk);
      });
    });
    this.rawServer = server;
    return new Promise((resolve) =>
      server.listen(0, this.host, () => resolve((server.address() as net.AddressInfo).port)),
    );
  }

  private rawSend(socket: net.Socket, count: number, chunk: number): void {
    const slab = this.ctx.slabs[0] as Uint8Array;
    let sent = 0;
    const pump = (): void => {
      while (sent < count) {
        if (socket.writableLength >= SEND_HIGH_WATER) {
          socket.once('drain', pump);
          return;
        }
        const at = sent % slab.length;
        const n = Math.min(chunk, count - sent, slab.length - at);
        socket.write(Buffer.from(slab.buffer, slab.byteOffset + at, n));
        sent += n;
      }
    };
    pump();
  }

  /** Baseline client: receive `bytes` from a rawServe port, copying every piece into slab 0. */
  rawRecv(host: string, port: number, bytes: number, chunkBytes: number): Promise<number> {
    const slab = this.ctx.slabs[0] as Uint8Array;
    return new Promise((resolve, reject) => {
      let got = 0;
      // Same receive path as ClientConn: onread into a reused 1 MiB buffer, then a copy into the slab.
      const socket = net.connect({
        host,
        port,
        onread: {
          buffer: Buffer.alloc(RECV_BUFFER_BYTES),
          callback: (n, buf) => {
            onData(buf.subarray(0, n));
            return true;
          },
        },
      });
      this.rawSockets.add(socket);
      socket.on('connect', () => {
        const req = Buffer.alloc(12);
        req.writeUInt32BE(Math.floor(bytes / 0x1_0000_0000), 0);
        req.writeUInt32BE(bytes % 0x1_0000_0000, 4);
        req.writeUInt32BE(chunkBytes, 8);
        socket.write(req);
      });
      const onData = (d: Uint8Array): void => {
        let pos = 0;
        while (pos < d.length) {
          const at = got % slab.length;
          const n = Math.min(d.length - pos, slab.length - at);
          slab.set(d.subarray(pos, pos + n), at);
          pos += n;
          got += n;
        }
        if (got >= bytes) {
          socket.destroy();
          this.rawSockets.delete(socket);
          resolve(got);
        }
      };
      socket.on('error', reject);
    });
  }
}
