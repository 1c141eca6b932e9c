/**
 * The raw-socket baseline of `handoff bench transfer --backend tcp`, run between the same two NIC
 * threads as the backend: plain TCP streams with no framing, no grants and no completion queue. The
 * sender writes zero-copy views of its slabs, `writeBytes` at a time, keeping up to `queueBytes` handed
 * to the socket (0: wait for 'drain' whenever write() says so), corked per burst when `cork`; the
 * receiver reads straight into its own slabs (onread with a fresh slab view per read: the kernel copies
 * into the destination, nothing else does); `conns` connections each carry a contiguous part.
 *
 * Both sides see their slabs as one concatenation (slab 0, then slab 1, ...); positions wrap around it.
 * The bench tries several configurations in the same run and keeps the fastest: the limit.
 */
import net from 'node:net';
import { assert } from '../../util/assert.ts';

export interface RawConfig {
  conns: number;
  writeBytes: number;
  /** Bytes kept handed to the socket before waiting for 'drain'; 0: respect write()'s return value. */
  queueBytes: number;
  cork: boolean;
}

const REQUEST_BYTES = 21;
const U32 = 0x1_0000_0000;
const READ_MAX_BYTES = 4 << 20;

/** A window into the concatenation of `slabs` at `pos` (mod its size), at most `max` bytes, one slab only. */
function windowAt(slabs: readonly Uint8Array[], pos: number, max: number): Uint8Array {
  const total = slabs.reduce((n, s) => n + s.length, 0);
  let at = pos % total;
  for (const s of slabs) {
    if (at < s.length) return new Uint8Array(s.buffer, s.byteOffset + at, Math.min(max, s.length - at));
    at -= s.length;
  }
  assert(false, 'windowAt: position beyond the slabs');
}

function encodeRequest(start: number, count: number, cfg: RawConfig): Buffer {
  const b = Buffer.alloc(REQUEST_BYTES);
  b.writeUInt32BE(Math.floor(start / U32), 0);
  b.writeUInt32BE(start % U32, 4);
  b.writeUInt32BE(Math.floor(count / U32), 8);
  b.writeUInt32BE(count % U32, 12);
  b.writeUInt32BE(cfg.writeBytes, 16);
  b[20] = (cfg.cork ? 1 : 0) | (cfg.queueBytes > 0 ? 2 : 0);
  return b;
}

/** One receiving connection, kept open between runs (as the backend keeps its data connection). */
interface RawConn {
  socket: net.Socket;
  ready: Promise<void>;
  job: { start: number; count: number; got: number; done: (n: number) => void; fail: (e: Error) => void } | null;
}

export class RawBaseline {
  private server: net.Server | null = null;
  private readonly sockets = new Set<net.Socket>();
  /** Receiving connections by `host:port`. */
  private readonly conns = new Map<string, RawConn[]>();

  constructor(
    private readonly slabs: readonly Uint8Array[],
    private readonly host: string,
    /** What a request that asks for queueing keeps handed to the socket. */
    private readonly queueBytes = 8 << 20,
  ) {}

  private track(socket: net.Socket): void {
    this.sockets.add(socket);
    socket.on('close', () => this.sockets.delete(socket));
    socket.on('error', () => {});
  }

  /** Listen for baseline receivers; each request on a connection asks for a part of the stream. */
  serve(): Promise<number> {
    const existing = this.server?.address();
    if (existing && typeof existing === 'object') return Promise.resolve(existing.port);
    const server = net.createServer((socket) => {
      this.track(socket);
      socket.setNoDelay(true);
      let req = Buffer.alloc(0);
      socket.on('data', (d: Buffer) => {
        req = Buffer.concat([req, d]);
        while (req.length >= REQUEST_BYTES) {
          const start = req.readUInt32BE(0) * U32 + req.readUInt32BE(4);
          const count = req.readUInt32BE(8) * U32 + req.readUInt32BE(12);
          const writeBytes = req.readUInt32BE(16);
          const flags = req[20] ?? 0;
          req = req.subarray(REQUEST_BYTES);
          if (writeBytes === 0) return void socket.destroy();
          this.send(socket, start, count, { writeBytes, cork: (flags & 1) !== 0, queue: (flags & 2) !== 0 });
        }
      });
    });
    this.server = server;
    return new Promise((resolve) =>
      server.listen(0, this.host, () => resolve((server.address() as net.AddressInfo).port)),
    );
  }

  private send(
    socket: net.Socket,
    start: number,
    count: number,
    o: { writeBytes: number; cork: boolean; queue: boolean },
  ): void {
    let sent = 0;
    const pump = (): void => {
      if (o.cork) socket.cork();
      while (sent < count && !socket.destroyed) {
        const view = windowAt(this.slabs, start + sent, Math.min(o.writeBytes, count - sent));
        const ok = socket.write(view);
        sent += view.length;
        const full = o.queue ? socket.writableLength >= this.queueBytes : !ok;
        if (full && sent < count) {
          if (o.cork) socket.uncork();
          socket.once('drain', pump);
          return;
        }
      }
      if (o.cork) socket.uncork();
    };
    pump();
  }

  /** Receive `bytes` from a serve() port over `cfg.conns` connections, straight into our slabs. */
  async recv(host: string, port: number, bytes: number, cfg: RawConfig): Promise<number> {
    assert(Number.isInteger(cfg.conns) && cfg.conns >= 1 && cfg.conns <= 16, 'raw baseline: 1..16 connections');
    const conns = this.connsTo(host, port, cfg.conns);
    const per = Math.ceil(bytes / cfg.conns);
    const parts: Promise<number>[] = [];
    for (let k = 0; k * per < bytes; k++) {
      const start = k * per;
      parts.push(this.recvPart(conns[k] as RawConn, start, Math.min(per, bytes - start), cfg));
    }
    const got = await Promise.all(parts);
    return got.reduce((a, b) => a + b, 0);
  }

  private connsTo(host: string, port: number, n: number): RawConn[] {
    const key = `${host}:${port}`;
    const list = (this.conns.get(key) ?? []).filter((c) => !c.socket.destroyed);
    while (list.length < n) list.push(this.connect(host, port));
    this.conns.set(key, list);
    return list;
  }

  private connect(host: string, port: number): RawConn {
    const spare = Buffer.alloc(64);
    const conn: RawConn = { socket: null as unknown as net.Socket, ready: Promise.resolve(), job: null };
    const socket = net.connect({
      host,
      port,
      onread: {
        // The kernel writes each read straight into the destination window.
        buffer: () => {
          const j = conn.job;
          return j && j.got < j.count
            ? windowAt(this.slabs, j.start + j.got, Math.min(READ_MAX_BYTES, j.count - j.got))
            : spare;
        },
        callback: (n, buf) => {
          const j = conn.job;
          if (j === null) return true;
          // A job's first bytes land in the spare buffer (it was armed while idle): copy those few over.
          for (let at = 0; buf === spare && at < n;) {
            const w = windowAt(this.slabs, j.start + j.got + at, n - at);
            w.set(spare.subarray(at, at + w.length));
            at += w.length;
          }
          j.got += n;
          if (j.got >= j.count) {
            conn.job = null;
            j.done(j.got);
          }
          return true;
        },
      },
    });
    conn.socket = socket;
    socket.once('close', () => conn.job?.fail(new Error(`raw baseline connection to ${host}:${port} closed`)));
    conn.ready = new Promise((resolve, reject) => {
      socket.once('connect', () => resolve());
      socket.once('error', reject);
    });
    this.track(socket);
    socket.setNoDelay(true);
    return conn;
  }

  private async recvPart(conn: RawConn, start: number, count: number, cfg: RawConfig): Promise<number> {
    await conn.ready;
    assert(conn.job === null, 'raw baseline: one request per connection at a time');
    const done = new Promise<number>((resolve, reject) => {
      conn.job = { start, count, got: 0, done: resolve, fail: reject };
    });
    conn.socket.write(encodeRequest(start, count, cfg));
    return done;
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    this.conns.clear();
    const server = this.server;
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}
