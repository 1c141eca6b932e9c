/**
 * tcp data-plane connections inside the NIC thread (frame layouts in frame.ts).
 *
 *   consumer NIC (ClientConn) --hello, read--> producer NIC (ServerConn): grant check, then DATA frames
 *   straight from its slabs (zero-copy views, ~1 MiB each) --> ClientConn copies each piece into its slab.
 *   producer NIC (ClientConn) --hello, write, DATA...--> consumer NIC (ServerConn): grant check, writes
 *   into its slabs, then `done`: a WRITE completes only when the destination says the bytes are there.
 *
 * A malformed or unexpected frame closes the connection; every work request on it fails with a
 * typed error. Nothing is written for a denied request.
 */
import net from 'node:net';
import {
  FrameDecoder,
  FrameError,
  encodeDataHeader,
  encodeFrame,
  type ControlFrame,
  type DataHead,
  type FrameSink,
} from './frame.ts';
import { COUNTER, asErrorCode, type TcpPeer, type WorkRequest } from '../nic/nic_messages.ts';
import type { NicContext } from '../nic/nic_worker.ts';
import { RangeStream, localSide, remoteSide, unpackRanges, type WireRange } from '../core/ranges.ts';
import type { ErrorCode } from '../../util/errors.ts';

/** Bytes handed to a socket but not yet flushed before the sender waits for 'drain'. */
export const SEND_HIGH_WATER = 8 << 20;
const WRITES_MAX = 4096;
const HELLO_TIMEOUT_MS = 5000;
export const RECV_BUFFER_BYTES = 1 << 20;

/** Streams transfers' bytes from our slabs as DATA frames, with backpressure. */
class Sender {
  private readonly queue: Array<{ reqId: number; stream: RangeStream; onSent: () => void }> = [];
  private waiting = false;

  constructor(
    private readonly socket: net.Socket,
    private readonly ctx: NicContext,
  ) {}

  has(reqId: number): boolean {
    return this.queue.some((q) => q.reqId === reqId);
  }

  enqueue(reqId: number, ranges: WireRange[], onSent: () => void): void {
    this.queue.push({ reqId, stream: new RangeStream(ranges), onSent });
    this.pump();
  }

  cancel(reqId: number): void {
    const i = this.queue.findIndex((q) => q.reqId === reqId);
    if (i >= 0) this.queue.splice(i, 1);
  }

  private pump(): void {
    while (this.queue.length > 0 && !this.socket.destroyed) {
      if (this.socket.writableLength >= SEND_HIGH_WATER) {
        if (!this.waiting) {
          this.waiting = true;
          this.socket.once('drain', () => {
            this.waiting = false;
            this.pump();
          });
        }
        return;
      }
      const item = this.queue[0];
      if (item === undefined) return;
      const { stream } = item;
      const len = Math.min(this.ctx.dataFrameBytes, stream.total - stream.expected);
      this.socket.cork();
      this.socket.write(encodeDataHeader(item.reqId, stream.expected, len));
      stream.advance(len, (slab, offset, _piece, seg) => {
        const s = this.ctx.slabs[slab] as Uint8Array;
        this.socket.write(Buffer.from(s.buffer, s.byteOffset + offset, seg));
      });
      this.socket.uncork();
      if (stream.complete) {
        this.queue.shift();
        item.onSent();
      }
    }
  }
}

/** Shared plumbing: decoder, close on bad frames, typed failure. */
abstract class Conn implements FrameSink {
  protected readonly decoder = new FrameDecoder(this);
  protected readonly sender: Sender;
  protected closedWith: { code: ErrorCode; message: string } | null = null;
  /** Bytes received so far (a READ that saw none arrive since it was posted means a stalled connection). */
  protected bytesIn = 0;

  constructor(
    readonly socket: net.Socket,
    protected readonly ctx: NicContext,
  ) {
    this.sender = new Sender(socket, ctx);
    socket.setNoDelay(true);
    socket.on('data', (chunk: Buffer) => this.onChunk(chunk));
    socket.on('error', () => {});
    socket.on('close', () => {
      this.closedWith ??= { code: 'PEER_UNAVAILABLE', message: 'connection closed by the peer' };
      this.onClosed(this.closedWith.code, this.closedWith.message);
    });
  }

  /** Bytes from the socket; the decoder copies what it keeps, so `chunk` may be reused afterwards. */
  onChunk(chunk: Uint8Array): void {
    if (this.closedWith !== null) return;
    this.bytesIn += chunk.length;
    try {
      this.decoder.push(chunk);
    } catch (e) {
      if (!(e instanceof FrameError)) throw e;
      this.ctx.count(COUNTER.badFrames);
      this.destroy('TRANSFER_FAILED', `bad frame: ${e.message}`);
    }
  }

  destroy(code: ErrorCode, message: string): void {
    this.closedWith ??= { code, message };
    this.socket.destroy();
  }

  protected send(f: ControlFrame): void {
    if (!this.socket.destroyed) this.socket.write(encodeFrame(f));
  }

  abstract frame(f: ControlFrame): void;
  abstract data(head: DataHead, piece: Uint8Array, pieceOffset: number): void;
  protected abstract onClosed(code: ErrorCode, message: string): void;
}

/** Checks that a DATA piece continues `stream` exactly. */
function expectPiece(stream: RangeStream, head: DataHead, piece: Uint8Array, pieceOffset: number): void {
  if (head.streamOffset + pieceOffset !== stream.expected)
    throw new FrameError(`DATA out of order for request ${head.reqId}`);
  if (head.streamOffset + head.length > stream.total)
    throw new FrameError(`DATA beyond the end of request ${head.reqId}`);
  if (piece.length === 0) throw new FrameError('empty DATA piece');
}

/** A peer connected to our data port: we serve its READs and accept its WRITEs. */
export class ServerConn extends Conn {
  private peer: string | null = null;
  private readonly writes = new Map<number, { stream: RangeStream; denied: boolean }>();

  constructor(socket: net.Socket, ctx: NicContext, onClosed: () => void) {
    super(socket, ctx);
    const timer = setTimeout(() => {
      if (this.peer === null) this.destroy('UNAUTHORIZED', 'no hello');
    }, HELLO_TIMEOUT_MS);
    socket.on('close', () => {
      clearTimeout(timer);
      onClosed();
    });
  }

  frame(f: ControlFrame): void {
    if (this.peer === null) {
      if (f.type !== 'hello') throw new FrameError('expected hello first');
      const peer = this.ctx.sessionPeer(f.session);
      if (peer === undefined || peer !== f.engineId) throw new FrameError('unknown data session');
      this.peer = peer;
      this.send({ type: 'helloOk' });
      return;
    }
    const peer = this.peer;
    switch (f.type) {
      case 'read': {
        const d = this.ctx.checkGrant(peer, f.transferId, f.grantToken, f.ranges);
        if (!d.ok) return this.deny(f.reqId, d.reason);
        this.sender.enqueue(f.reqId, f.ranges, () => this.ctx.count(COUNTER.readsServed));
        return;
      }
      case 'write': {
        if (this.writes.has(f.reqId)) throw new FrameError(`write ${f.reqId} announced twice`);
        if (this.writes.size >= WRITES_MAX) throw new FrameError('too many writes in flight');
        const d = this.ctx.checkGrant(peer, f.transferId, f.grantToken, f.ranges);
        this.writes.set(f.reqId, { stream: new RangeStream(f.ranges), denied: !d.ok });
        if (!d.ok) this.deny(f.reqId, d.reason);
        return;
      }
      case 'error':
        // The writer gave up on a WRITE: forget its partial state.
        this.writes.delete(f.reqId);
        return;
      default:
        throw new FrameError(`unexpected ${f.type} frame from a client`);
    }
  }

  data(head: DataHead, piece: Uint8Array, pieceOffset: number): void {
    const w = this.writes.get(head.reqId);
    if (w === undefined) throw new FrameError(`DATA for unknown write ${head.reqId}`);
    expectPiece(w.stream, head, piece, pieceOffset);
    if (w.denied) w.stream.skip(piece.length);
    else {
      w.stream.advance(piece.length, (slab, offset, at, seg) => {
        (this.ctx.slabs[slab] as Uint8Array).set(piece.subarray(at, at + seg), offset);
      });
    }
    if (!w.stream.complete) return;
    this.writes.delete(head.reqId);
    if (w.denied) return;
    this.ctx.count(COUNTER.writesAccepted);
    this.send({ type: 'done', reqId: head.reqId });
  }

  private deny(reqId: number, reason: string): void {
    this.send({
      type: 'error',
      reqId,
      code: 'GRANT_DENIED',
      message: `grant denied by ${this.ctx.engineId}: ${reason}`,
    });
  }

  protected onClosed(): void {
    this.writes.clear();
  }
}

/** Our connection to a peer's data port: we post READs and WRITEs on it. */
export class ClientConn extends Conn {
  private readonly reads = new Map<number, { stream: RangeStream; bytesInAtPost: number }>();
  /** Aborted READs whose bytes may still arrive: skipped, never written. */
  private readonly discard = new Map<number, RangeStream>();
  private readonly writes = new Set<number>();
  private readonly ignore = new Set<number>();

  private constructor(
    socket: net.Socket,
    ctx: NicContext,
    readonly peerEngineId: string,
    readonly peer: TcpPeer,
    private readonly onGone: (c: ClientConn) => void,
  ) {
    super(socket, ctx);
    this.send({ type: 'hello', engineId: ctx.engineId, session: peer.session });
  }

  /** Reads land in one reused 1 MiB buffer (onread): fewer, larger reads than 'data' events. */
  static connect(ctx: NicContext, peerEngineId: string, peer: TcpPeer, onGone: (c: ClientConn) => void): ClientConn {
    const holder: { conn: ClientConn | null } = { conn: null };
    const socket = net.connect({
      host: peer.host,
      port: peer.port,
      onread: {
        buffer: Buffer.alloc(RECV_BUFFER_BYTES),
        callback: (n, buf) => {
          holder.conn?.onChunk(buf.subarray(0, n));
          return true;
        },
      },
    });
    holder.conn = new ClientConn(socket, ctx, peerEngineId, peer, onGone);
    return holder.conn;
  }

  get idle(): boolean {
    return this.reads.size === 0 && this.writes.size === 0;
  }

  post(wr: WorkRequest): void {
    const ranges = unpackRanges(wr.ranges);
    const frame = { reqId: wr.wrId, transferId: wr.transferId, grantToken: wr.grantToken, ranges: remoteSide(ranges) };
    if (wr.kind === 'read') {
      this.reads.set(wr.wrId, { stream: new RangeStream(localSide(ranges)), bytesInAtPost: this.bytesIn });
      this.send({ type: 'read', ...frame });
    } else {
      this.writes.add(wr.wrId);
      this.send({ type: 'write', ...frame });
      this.sender.enqueue(wr.wrId, localSide(ranges), () => {});
    }
  }

  /**
   * After this returns, no byte for `wrId` is written into our slabs. Returns true when `wrId` was a
   * READ and not one byte arrived on this connection since it was posted: the connection is stalled.
   */
  abort(wrId: number): boolean {
    const r = this.reads.get(wrId);
    if (r !== undefined) {
      this.reads.delete(wrId);
      this.discard.set(wrId, r.stream);
    }
    if (this.writes.delete(wrId)) this.cancelWrite(wrId);
    return r !== undefined && this.bytesIn === r.bytesInAtPost;
  }

  private cancelWrite(wrId: number): void {
    this.sender.cancel(wrId);
    this.ignore.add(wrId);
    this.send({ type: 'error', reqId: wrId, code: 'REQUEST_ABORTED', message: 'write cancelled' });
  }

  frame(f: ControlFrame): void {
    switch (f.type) {
      case 'helloOk':
        return;
      case 'done':
        if (this.ignore.delete(f.reqId)) return;
        if (!this.writes.has(f.reqId) || this.sender.has(f.reqId))
          throw new FrameError(`unexpected done for ${f.reqId}`);
        this.writes.delete(f.reqId);
        this.ctx.complete(f.reqId, null, '');
        return;
      case 'error': {
        const code = asErrorCode(f.code);
        if (this.ignore.delete(f.reqId) || this.discard.delete(f.reqId)) return;
        if (this.reads.delete(f.reqId)) return this.ctx.complete(f.reqId, code, f.message);
        if (this.writes.delete(f.reqId)) {
          this.sender.cancel(f.reqId);
          this.send({ type: 'error', reqId: f.reqId, code: 'REQUEST_ABORTED', message: 'write refused' });
          return this.ctx.complete(f.reqId, code, f.message);
        }
        throw new FrameError(`error for unknown request ${f.reqId}`);
      }
      default:
        throw new FrameError(`unexpected ${f.type} frame from a server`);
    }
  }

  data(head: DataHead, piece: Uint8Array, pieceOffset: number): void {
    const r = this.reads.get(head.reqId);
    const stream = r?.stream ?? this.discard.get(head.reqId);
    if (stream === undefined) throw new FrameError(`DATA for unknown read ${head.reqId}`);
    expectPiece(stream, head, piece, pieceOffset);
    if (r === undefined) stream.skip(piece.length);
    else {
      stream.advance(piece.length, (slab, offset, at, seg) => {
        (this.ctx.slabs[slab] as Uint8Array).set(piece.subarray(at, at + seg), offset);
      });
    }
    if (!stream.complete) return;
    if (r === undefined) this.discard.delete(head.reqId);
    else {
      this.reads.delete(head.reqId);
      this.ctx.complete(head.reqId, null, '');
    }
  }

  protected onClosed(code: ErrorCode, message: string): void {
    const why = `${message} (peer ${this.peerEngineId})`;
    for (const wrId of this.reads.keys()) this.ctx.complete(wrId, code, why);
    for (const wrId of this.writes) this.ctx.complete(wrId, code, why);
    this.reads.clear();
    this.writes.clear();
    this.discard.clear();
    this.onGone(this);
  }
}
