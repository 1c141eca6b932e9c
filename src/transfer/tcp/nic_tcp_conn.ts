/**
 * tcp data-plane connections inside the NIC thread (frame layouts in frame.ts): the shared plumbing and
 * the serving side (ServerConn); the requesting side is nic_tcp_client.ts.
 *
 *   consumer NIC (ClientConn) --hello, read--> producer NIC (ServerConn): grant check, then DATA frames
 *   straight from its slabs (zero-copy views, tcp_sender.ts) --> ClientConn: the kernel reads each
 *   payload segment of at least recvDirectMinBytes straight into its destination in our slab (no copy in
 *   JS); smaller segments arrive in a reused buffer and are copied (nic_tcp_client.ts).
 *   producer NIC (ClientConn) --hello, write, DATA...--> consumer NIC (ServerConn): grant check, writes
 *   into its slabs, then `done`: a WRITE completes only when the destination says the bytes are there.
 *   A socket read copies what it holds into the pages; with scatter receive (drainScatter) the rest of
 *   the payload still in the kernel is then read by readv straight into them.
 *
 * Scatter receive (the native addon, ctx.scatterRecv) is shared by both sides: see drainScatter.
 *
 * A malformed or unexpected frame closes the connection; every work request on it fails with a
 * typed error. Nothing is written for a denied request.
 */
import type net from 'node:net';
import { FrameDecoder, FrameError, encodeFrame, type ControlFrame, type DataHead, type FrameSink } from './frame.ts';
import { COUNTER } from '../nic/nic_messages.ts';
import type { NicContext } from '../nic/nic_worker.ts';
import { RangeStream, wireSide } from '../core/ranges.ts';
import { SEND_HIGH_WATER, Sender } from './tcp_sender.ts';
import type { ErrorCode } from '../../util/errors.ts';
import { SCATTER_SEGS_MAX, scatterNative, socketFd, type ScatterNative } from './scatter_native.ts';

const WRITES_MAX = 4096;
const HELLO_TIMEOUT_MS = 5000;

/** Shared plumbing: decoder, close on bad frames, typed failure. */
export abstract class Conn implements FrameSink {
  protected readonly decoder = new FrameDecoder(this);
  protected readonly sender: Sender;
  protected closedWith: { code: ErrorCode; message: string } | null = null;
  /** Bytes received so far (a READ that saw none arrive since it was posted means a stalled connection). */
  protected bytesIn = 0;
  /** When bytes last moved on this connection (in, or out to the kernel), or a request was last sent. */
  protected lastMoveMs = performance.now();
  /** Payload bytes the kernel wrote straight into their destination pages (never copied in JS). */
  bytesInPlace = 0;
  /** readv calls that moved bytes (scatter receive). */
  scatterReads = 0;
  protected readonly scatter: ScatterNative | null;
  private readonly segs: Float64Array;

  constructor(
    readonly socket: net.Socket,
    protected readonly ctx: NicContext,
  ) {
    this.sender = new Sender(socket, ctx.slabs, ctx.dataFrameBytes, () => (this.lastMoveMs = performance.now()));
    this.scatter = ctx.scatterRecv ? scatterNative() : null;
    this.segs = new Float64Array(this.scatter === null ? 0 : 3 * SCATTER_SEGS_MAX);
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
    this.lastMoveMs = performance.now();
    try {
      this.decoder.push(chunk);
    } catch (e) {
      if (!(e instanceof FrameError)) throw e;
      this.ctx.count(COUNTER.badFrames);
      this.destroy('TRANSFER_FAILED', `bad frame: ${e.message}`);
    }
  }

  /**
   * Scatter receive: while a live transfer's payload is next (a READ reply on a ClientConn, a WRITE's
   * payload on a ServerConn) and its DATA head continues the transfer exactly, readv as much of it as the
   * socket holds straight into its pages; the decoder and the transfer's stream move past those bytes
   * without looking at them. The kernel writes our pages only inside the call, on this thread, for a
   * transfer still live: never racing libuv's own reads (they run on this thread too) nor an abort.
   */
  protected drainScatter(): void {
    const scatter = this.scatter;
    if (scatter === null) return;
    for (;;) {
      if (this.closedWith !== null) return;
      const pending = this.decoder.payloadPending;
      if (pending === null) return;
      const stream = this.liveStream(pending.reqId);
      const fd = socketFd(this.socket);
      if (stream === undefined || fd < 0 || !continues(stream, pending)) return;
      const { count, bytes } = stream.peekSegments(this.segs, SCATTER_SEGS_MAX, pending.left);
      const n = scatter.scatterRead(fd, this.ctx.slabs, this.segs, count);
      if (n === 0) return;
      this.scatterReads++;
      this.ctx.count(COUNTER.scatterReads);
      this.bytesIn += n;
      this.bytesInPlace += n;
      this.decoder.payloadInPlace(n);
      stream.skip(n);
      this.landedInPlace(pending.reqId);
      if (n < bytes) return;
    }
  }

  destroy(code: ErrorCode, message: string): void {
    this.closedWith ??= { code, message };
    this.socket.destroy();
  }

  /** Settles once this connection no longer reads `transferId`'s pages (tcp_sender.ts drained). */
  drained(transferId: string): Promise<void> {
    return this.sender.drained(transferId);
  }

  protected send(f: ControlFrame): void {
    if (!this.socket.destroyed) this.socket.write(encodeFrame(f));
  }

  /** The stream of a live transfer whose payload may be read in place, or undefined. */
  protected abstract liveStream(reqId: number): RangeStream | undefined;
  /** Bytes of `reqId`'s payload were read in place: finish it if that was its last byte. */
  protected abstract landedInPlace(reqId: number): void;
  abstract frame(f: ControlFrame): void;
  abstract data(head: DataHead, piece: Uint8Array, pieceOffset: number): void;
  protected abstract onClosed(code: ErrorCode, message: string): void;
}

/** The DATA payload at `at` of `head` continues `stream` exactly and stays inside it (as expectPiece checks). */
export function continues(stream: RangeStream, p: { head: DataHead; at: number }): boolean {
  return p.head.streamOffset + p.at === stream.expected && p.head.streamOffset + p.head.length <= stream.total;
}

/** Checks that a DATA piece continues `stream` exactly. */
export function expectPiece(stream: RangeStream, head: DataHead, piece: Uint8Array, pieceOffset: number): void {
  if (head.streamOffset + pieceOffset !== stream.expected)
    throw new FrameError(`DATA out of order for request ${head.reqId}`);
  if (head.streamOffset + head.length > stream.total)
    throw new FrameError(`DATA beyond the end of request ${head.reqId}`);
  if (piece.length === 0) throw new FrameError('empty DATA piece');
}

/** A peer connected to our data port: we serve its READs and accept its WRITEs. */
export class ServerConn extends Conn {
  private peer: string | null = null;
  private readonly writes = new Map<number, { transferId: string; stream: RangeStream; denied: boolean }>();
  /** Not reading the peer's requests until our replies drain (onChunk). */
  private paused = false;

  constructor(
    socket: net.Socket,
    ctx: NicContext,
    onClosed: () => void,
    /** The peer said hello (the plane bounds the connections of each peer). */
    private readonly onHello: (c: ServerConn) => void = () => {},
  ) {
    super(socket, ctx);
    const timer = setTimeout(() => {
      if (this.peer === null) this.destroy('UNAUTHORIZED', 'no hello');
    }, HELLO_TIMEOUT_MS);
    socket.on('close', () => {
      clearTimeout(timer);
      onClosed();
    });
  }

  /** The engine that said hello with a valid session, or null before its hello. */
  get peerEngineId(): string | null {
    return this.peer;
  }

  frame(f: ControlFrame): void {
    if (this.peer === null) {
      if (f.type !== 'hello') throw new FrameError('expected hello first');
      const peer = this.ctx.sessionPeer(f.session);
      if (peer === undefined || peer !== f.engineId) throw new FrameError('unknown data session');
      this.peer = peer;
      this.send({ type: 'helloOk' });
      this.onHello(this);
      return;
    }
    const peer = this.peer;
    switch (f.type) {
      case 'read': {
        const ranges = wireSide(f.ranges);
        const d = this.ctx.checkGrant(peer, f.transferId, f.grantToken, ranges, f.reqId);
        if (!d.ok) return this.deny(f.reqId, d.reason);
        this.sender.enqueue(f.reqId, f.transferId, ranges, () => this.ctx.count(COUNTER.readsServed));
        return;
      }
      case 'write': {
        if (this.writes.has(f.reqId)) throw new FrameError(`write ${f.reqId} announced twice`);
        if (this.writes.size >= WRITES_MAX) throw new FrameError('too many writes in flight');
        const ranges = wireSide(f.ranges);
        const d = this.ctx.checkGrant(peer, f.transferId, f.grantToken, ranges, f.reqId);
        this.writes.set(f.reqId, { transferId: f.transferId, stream: new RangeStream(ranges), denied: !d.ok });
        if (!d.ok) this.deny(f.reqId, d.reason);
        return;
      }
      case 'error': {
        // The writer gave up on a WRITE: forget its partial state, and answer it if nothing did yet (the
        // writer drops exactly one answer per WRITE it gave up on; without one its note of it stayed).
        const w = this.writes.get(f.reqId);
        this.writes.delete(f.reqId);
        if (w !== undefined && !w.denied)
          this.send({ type: 'error', reqId: f.reqId, code: 'REQUEST_ABORTED', message: 'write cancelled' });
        // The reader gave up on a READ whose reply is still queued here: what is not yet handed to the
        // socket is not sent, and the answer behind what was tells the reader its reply ends there. A
        // reply already sent whole (or refused) needs no answer: the reader took its end from it.
        if (w === undefined && this.sender.has(f.reqId)) {
          this.sender.cancel(f.reqId);
          this.send({ type: 'error', reqId: f.reqId, code: 'REQUEST_ABORTED', message: 'read cancelled' });
        }
        return;
      }
      default:
        throw new FrameError(`unexpected ${f.type} frame from a client`);
    }
  }

  /**
   * Bytes from the socket, then as much of a live WRITE's payload as the socket holds, read in place
   * (only when Node holds no later chunk of the stream: after a pause it hands them over one by one).
   * A peer that does not read our replies: once SEND_HIGH_WATER bytes wait in the socket we stop reading
   * its requests until they drained, so neither the queued READs nor the replies grow without bound.
   */
  override onChunk(chunk: Uint8Array): void {
    super.onChunk(chunk);
    if (this.socket.readableLength === 0) this.drainScatter();
    if (this.paused || this.socket.destroyed || this.socket.writableLength < SEND_HIGH_WATER) return;
    this.paused = true;
    this.socket.pause();
    this.socket.once('drain', () => {
      this.paused = false;
      this.socket.resume();
    });
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
    this.finishWrite(head.reqId);
  }

  /**
   * `transferId`'s grant was revoked: its WRITEs under way land no further byte (the rest of each payload
   * is read and dropped) and are answered GRANT_DENIED, not done. Landing runs on this thread only, so
   * once this returns nothing of them reaches the pages: the consumer may reuse them after the drain.
   */
  revoked(transferId: string): void {
    for (const [reqId, w] of this.writes) {
      if (w.transferId !== transferId || w.denied) continue;
      w.denied = true;
      this.ctx.count(COUNTER.writesCut);
      this.deny(reqId, `the grant of ${transferId} was revoked while its WRITE was landing`);
    }
  }

  protected liveStream(reqId: number): RangeStream | undefined {
    const w = this.writes.get(reqId);
    return w === undefined || w.denied ? undefined : w.stream;
  }

  protected landedInPlace(reqId: number): void {
    this.finishWrite(reqId);
  }

  /** A WRITE whose last byte arrived: forgotten, and answered `done` unless it was denied. */
  private finishWrite(reqId: number): void {
    const w = this.writes.get(reqId);
    if (w === undefined || !w.stream.complete) return;
    this.writes.delete(reqId);
    if (w.denied) return;
    this.ctx.count(COUNTER.writesAccepted);
    this.send({ type: 'done', reqId });
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
