/**
 * Our connection to a peer's data port (inside the NIC thread): we post READs and WRITEs on it.
 *
 * Receive path of a READ reply: with the native addon (ctx.scatterRecv), as soon as a live READ's payload
 * is next, readv(2) takes as much of it as the socket holds straight into its pages, up to 1,024 pages per
 * call (scatter receive, drainScatter); the socket's own next read then goes into the next page (any
 * length) or takes exactly the next frame header. Without it, the socket reads into whatever nextBuffer()
 * chose after the previous read (Node's onread with a buffer per read):
 *   - inside a DATA payload whose current destination segment is >= recvDirectMinBytes: a view of
 *     exactly that segment of our slab — the kernel copies the bytes to their destination, JS does not;
 *   - at a frame boundary while a READ with such segments is next: exactly the 17 header bytes, so the
 *     payload after them can go direct;
 *   - otherwise a reused 1 MiB buffer, and its DATA pieces are copied to their destinations.
 *
 * A payload is read in place (readv or a slab view) only when its DATA head continues the READ's stream
 * exactly and stays inside it; any other frame goes through the copy path, which rejects it, so no byte
 * of a malformed frame reaches our pages.
 *
 * Invariant: a slab view is armed only for a READ still in `reads`. Aborting that READ while its view is
 * armed acknowledges only once the next read has disarmed it (or the connection closed): until then the
 * kernel may still write the pages, as an RDMA NIC may until it acknowledges.
 */
import net from 'node:net';
import { FRAME_HEADER_BYTES, FrameError, type ControlFrame, type DataHead } from './frame.ts';
import { Conn, continues, expectPiece } from './nic_tcp_conn.ts';
import { asErrorCode, type TcpPeer, type WorkRequest } from '../nic/nic_messages.ts';
import type { NicContext } from '../nic/nic_worker.ts';
import { RangeStream, sideOf, sortedBy, toWire } from '../core/ranges.ts';
import type { ErrorCode } from '../../util/errors.ts';

const RECV_BUFFER_BYTES = 1 << 20;
/** An abort of a READ whose slab view is armed waits at most this long for the next read, then drops the connection. */
const ARMED_ABORT_MS = 200;
/**
 * After a request in flight here was aborted, a connection that still carries work and moves not one byte
 * either way for this long is dropped: a stalled link (TCP in backoff after a cut) would hold every later
 * request to the peer behind what it still owes.
 */
const ABORT_STALL_MS = 1000;
/** An abort finding the connection still this long (no byte in or out) retires it (ClientConn.retire). */
const STILL_MS = 250;
/**
 * A connection carrying work (a READ's reply owed, a WRITE's payload or `done`) on which not one byte moves
 * either way for this long is dropped (watchSilence). A healthy peer answers within milliseconds, and a
 * long transfer moves bytes all along; this bound is for a peer that hung.
 */
export const SILENT_PEER_MS = 2000;

export class ClientConn extends Conn {
  private readonly reads = new Map<number, { stream: RangeStream; bytesInAtPost: number; postedAtMs: number }>();
  /** Aborted READs whose bytes may still arrive: skipped, never written. */
  private readonly discard = new Map<number, RangeStream>();
  private readonly writes = new Set<number>();
  private readonly ignore = new Set<number>();
  private readonly recvBuffer = Buffer.alloc(RECV_BUFFER_BYTES);
  /** The READ whose slab segment the socket reads into next, or null. */
  private armed: number | null = null;
  /** Abort acknowledgements waiting for the armed view to be replaced. */
  private disarmWaiters: Array<() => void> = [];
  /** Segments at least this long are read in place by the socket itself (1 with scatter receive). */
  private readonly directMin: number;
  /**
   * A request in flight here was aborted while nothing had moved on this connection for STILL_MS (a stalled
   * link, likely): the plane posts no new request here; it finishes what it carries and closes once idle.
   */
  retiring = false;
  /** A stall watch runs (watchStall). */
  private watching = false;
  /** A silence watch runs (watchSilence). */
  private listening = false;
  /** The peer answered our hello: its process reads and answers on this port. */
  greeted = false;
  /** Dropped by the silence watch: the peer hung with work in flight (the plane stops posting to it). */
  wentSilent = false;
  /** Runs once, when the peer's helloOk arrives (the plane's probe of a peer that went silent). */
  onGreeted: ((c: ClientConn) => void) | null = null;

  private constructor(
    socket: net.Socket,
    ctx: NicContext,
    readonly peerEngineId: string,
    readonly peer: TcpPeer,
    private readonly onGone: (c: ClientConn) => void,
    /** Where a work request carried here ends (the plane's lane aggregator, or the NIC). */
    private readonly done: (wrId: number, code: ErrorCode | null, message: string) => void,
  ) {
    super(socket, ctx);
    this.directMin = this.scatter === null ? ctx.recvDirectMinBytes : 1;
    this.send({ type: 'hello', engineId: ctx.engineId, session: peer.session });
  }

  static connect(
    ctx: NicContext,
    peerEngineId: string,
    peer: TcpPeer,
    onGone: (c: ClientConn) => void,
    done: (wrId: number, code: ErrorCode | null, message: string) => void = (w, c, m) => ctx.complete(w, c, m),
  ): ClientConn {
    const holder: { conn: ClientConn | null } = { conn: null };
    const socket = net.connect({
      host: peer.host,
      port: peer.port,
      onread: {
        // Before the connection object exists: the first read takes the peer's helloOk (a bare header).
        buffer: () => holder.conn?.nextBuffer() ?? Buffer.alloc(FRAME_HEADER_BYTES),
        callback: (n, buf) => {
          holder.conn?.onChunk(buf.subarray(0, n));
          return true;
        },
      },
    });
    holder.conn = new ClientConn(socket, ctx, peerEngineId, peer, onGone, done);
    return holder.conn;
  }

  get idle(): boolean {
    return this.reads.size === 0 && this.writes.size === 0;
  }

  /** The buffer the socket reads into next (module comment). Runs after every read. */
  private nextBuffer(): Uint8Array {
    this.armed = null;
    const buffer = this.chooseBuffer();
    if (this.disarmWaiters.length > 0 && this.armed === null) this.flushDisarmWaiters();
    return buffer;
  }

  private chooseBuffer(): Uint8Array {
    this.drainScatter(); // may close the connection, or finish a READ
    if (this.closedWith !== null) return this.recvBuffer;
    const pending = this.decoder.payloadPending;
    if (pending !== null) {
      const stream = this.reads.get(pending.reqId)?.stream;
      // A frame that does not continue its READ goes through the copy path, which rejects it: no byte of
      // it is read into our pages.
      if (stream === undefined || !continues(stream, pending)) return this.recvBuffer;
      const seg = stream.segment(pending.left);
      const n = Math.min(pending.left, seg.length);
      if (n < this.directMin) return this.recvBuffer;
      const slab = this.ctx.slabs[seg.slab] as Uint8Array;
      this.armed = pending.reqId;
      return new Uint8Array(slab.buffer, slab.byteOffset + seg.offset, n);
    }
    const headerLeft = this.decoder.dataHeaderLeft;
    if (headerLeft > 0 && this.nextReadGoesDirect()) return this.recvBuffer.subarray(0, headerLeft);
    return this.recvBuffer;
  }

  /** The oldest READ in flight (the one the peer answers next) continues with a segment worth reading direct. */
  private nextReadGoesDirect(): boolean {
    const min = this.directMin;
    for (const r of this.reads.values()) return r.stream.segment(min).length >= min;
    return false;
  }

  /** A live READ's stream (scatter receive reads only for these). */
  protected liveStream(reqId: number): RangeStream | undefined {
    return this.reads.get(reqId)?.stream;
  }

  /** A live READ's payload arrived in place (readv): the READ completes with its last byte. */
  protected landedInPlace(reqId: number): void {
    const r = this.reads.get(reqId);
    if (r === undefined || !r.stream.complete) return;
    this.reads.delete(reqId);
    this.done(reqId, null, '');
    this.closeIfRetired();
  }

  /** Bytes from the socket; a retired connection closes once they finished what it carried. */
  override onChunk(chunk: Uint8Array): void {
    super.onChunk(chunk);
    this.closeIfRetired();
  }

  private flushDisarmWaiters(): void {
    const ws = this.disarmWaiters;
    this.disarmWaiters = [];
    for (const w of ws) w();
  }

  post(wr: WorkRequest): void {
    // A READ's stream is ordered by destination: pages that are neighbours here arrive as one run, read
    // in place in one go, however scattered they are at the peer (its sender gathers them, zero-copy).
    // The posted ranges are a view of the host's ring, valid while pending: the connection keeps a copy.
    const ranges = sortedBy(wr.ranges.slice(), wr.kind === 'read' ? 'local' : 'remote'); // ours to keep
    const frame = {
      reqId: wr.wrId,
      transferId: wr.transferId,
      grantToken: wr.grantToken,
      ranges: toWire(sideOf(ranges, 'remote')),
    };
    this.lastMoveMs = performance.now();
    this.watchSilence();
    if (wr.kind === 'read') {
      this.reads.set(wr.wrId, {
        stream: new RangeStream(sideOf(ranges, 'local')),
        bytesInAtPost: this.bytesIn,
        postedAtMs: performance.now(),
      });
      this.send({ type: 'read', ...frame });
    } else {
      this.writes.add(wr.wrId);
      this.send({ type: 'write', ...frame });
      this.sender.enqueue(wr.wrId, wr.transferId, sideOf(wr.ranges, 'local'), () => {});
    }
  }

  /**
   * Stop writing our slabs for `wrId`. 'done': nothing more is written for it. 'stalled': it was a READ
   * and not one byte arrived on this connection since it was posted, STILL_MS or more ago (the caller
   * drops the connection, which stops everything). 'armed': the socket's next read still lands in its
   * pages; whenDisarmed() tells when it no longer does. Never 'stalled' when `detectStall` is false.
   */
  abort(wrId: number, detectStall = true): 'done' | 'stalled' | 'armed' {
    const r = this.reads.get(wrId);
    if (r !== undefined) {
      this.reads.delete(wrId);
      this.discard.set(wrId, r.stream);
    }
    const wasWrite = this.writes.delete(wrId);
    if (wasWrite) this.cancelWrite(wrId);
    // Silence proves a stall only after a while: a READ aborted within a round trip of its post (its reply
    // could not have come yet) says nothing of the link, and dropping it failed the READs beside it. A
    // link that is stalled after all is dropped by the watch below (watchStall).
    if (
      detectStall &&
      r !== undefined &&
      this.bytesIn === r.bytesInAtPost &&
      performance.now() - r.postedAtMs >= STILL_MS
    )
      return 'stalled';
    // The server stops the reply where it is (what it did not yet hand to its socket is never sent) and
    // answers REQUEST_ABORTED behind what it sent: the READs after it on this connection do not wait
    // for the rest. A server that does not know this answer ignores it and sends the whole reply.
    if (r !== undefined && this.closedWith === null)
      this.send({ type: 'error', reqId: wrId, code: 'REQUEST_ABORTED', message: 'read cancelled' });
    if (r !== undefined || wasWrite) {
      this.watchStall();
      if (performance.now() - this.lastMoveMs >= STILL_MS) this.retiring = true;
    }
    this.closeIfRetired();
    return this.armed === wrId ? 'armed' : 'done';
  }

  /** A retired connection with nothing left to carry closes. */
  private closeIfRetired(): void {
    if (!this.retiring || this.closedWith !== null || !this.idle || this.discard.size > 0) return;
    this.destroy('PEER_UNAVAILABLE', 'retired after an abort');
  }

  /** Bytes moved so far: received, and sent (taken from Node's queue). */
  private get progress(): number {
    return this.bytesIn + (this.socket.bytesWritten - this.socket.writableLength);
  }

  /**
   * A request in flight here was aborted (its timeout): it may have stopped on a stalled link (a cut, TCP in
   * backoff), and the rest of its reply or payload, and every later request, would wait behind it. Watch the
   * connection: while it still has work (the rest of an aborted reply, queued bytes, later requests) and
   * not one byte moves either way for ABORT_STALL_MS, drop it (its requests fail now, not at their own
   * timeouts); the next work request opens a fresh one. One watch at a time; it ends when the connection
   * is idle.
   */
  private watchStall(): void {
    if (this.watching) return;
    this.watching = true;
    const before = this.progress;
    const timer = setTimeout(() => {
      this.watching = false;
      if (this.closedWith !== null) return;
      const busy = !this.idle || this.discard.size > 0 || this.socket.writableLength > 0;
      if (!busy) return;
      if (this.progress !== before) return this.watchStall();
      this.destroy('PEER_UNAVAILABLE', `no data moved to or from ${this.peerEngineId} after an abort`);
    }, ABORT_STALL_MS);
    timer.unref();
  }

  /**
   * A peer that hangs (a stopped process, a host gone without a FIN) with work in flight here held every
   * READ to it, and with them decode's step and every request of that decode, until the transfer timeout
   * (30 s by default). While the connection carries work and not one byte moves either way for
   * silentPeerMs, it is dropped: its requests fail now (PEER_UNAVAILABLE, decode's load failure policy
   * takes over) and the next work request opens a fresh connection. One watch at a time; it ends when the
   * connection is idle or closed.
   */
  private watchSilence(): void {
    if (this.listening) return;
    this.listening = true;
    const bound = this.ctx.silentPeerMs ?? SILENT_PEER_MS;
    let seen = this.progress;
    let stillSinceMs = performance.now();
    const tick = (): void => {
      const busy = !this.idle || this.discard.size > 0 || this.socket.writableLength > 0;
      if (this.closedWith !== null || !busy) {
        this.listening = false;
        return;
      }
      const now = performance.now();
      if (this.progress !== seen) {
        seen = this.progress;
        stillSinceMs = now;
      } else if (now - stillSinceMs >= bound) {
        this.listening = false;
        this.wentSilent = true;
        const n = this.reads.size + this.writes.size;
        return this.destroy(
          'PEER_UNAVAILABLE',
          `no byte moved to or from ${this.peerEngineId} for ${bound} ms (${n} requests in flight)`,
        );
      }
      setTimeout(tick, Math.max(1, bound / 4)).unref();
    };
    setTimeout(tick, Math.max(1, bound / 4)).unref();
  }

  /** `fn` runs once the armed slab view is replaced; a connection silent for ARMED_ABORT_MS is dropped first. */
  whenDisarmed(fn: () => void): void {
    if (this.armed === null) return fn();
    const timer = setTimeout(
      () => this.destroy('PEER_UNAVAILABLE', `no data from ${this.peerEngineId} while aborting a READ`),
      ARMED_ABORT_MS,
    );
    this.disarmWaiters.push(() => {
      clearTimeout(timer);
      fn();
    });
  }

  private cancelWrite(wrId: number): void {
    this.sender.cancel(wrId);
    this.ignore.add(wrId);
    this.send({ type: 'error', reqId: wrId, code: 'REQUEST_ABORTED', message: 'write cancelled' });
  }

  frame(f: ControlFrame): void {
    switch (f.type) {
      case 'helloOk':
        this.greeted = true;
        return this.onGreeted?.(this);
      case 'done':
        if (this.ignore.delete(f.reqId)) return;
        if (!this.writes.has(f.reqId) || this.sender.has(f.reqId))
          throw new FrameError(`unexpected done for ${f.reqId}`);
        this.writes.delete(f.reqId);
        this.done(f.reqId, null, '');
        return;
      case 'error': {
        const code = asErrorCode(f.code);
        if (this.ignore.delete(f.reqId)) return;
        // An aborted READ's reply ends here (cut short by the server, or refused before it began).
        if (this.discard.delete(f.reqId)) return this.closeIfRetired();
        if (this.reads.delete(f.reqId)) return this.done(f.reqId, code, f.message);
        if (this.writes.delete(f.reqId)) {
          this.sender.cancel(f.reqId);
          this.send({ type: 'error', reqId: f.reqId, code: 'REQUEST_ABORTED', message: 'write refused' });
          return this.done(f.reqId, code, f.message);
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
        const s = this.ctx.slabs[slab] as Uint8Array;
        // A piece the kernel read straight into its destination is already there.
        if (piece.buffer === s.buffer && piece.byteOffset + at === s.byteOffset + offset) {
          this.bytesInPlace += seg;
          return;
        }
        s.set(piece.subarray(at, at + seg), offset);
      });
    }
    if (!stream.complete) return;
    if (r === undefined) this.discard.delete(head.reqId);
    else {
      this.reads.delete(head.reqId);
      this.done(head.reqId, null, '');
    }
  }

  protected onClosed(code: ErrorCode, message: string): void {
    const why = `${message} (peer ${this.peerEngineId})`;
    for (const wrId of this.reads.keys()) this.done(wrId, code, why);
    for (const wrId of this.writes) this.done(wrId, code, why);
    this.reads.clear();
    this.writes.clear();
    this.discard.clear();
    this.armed = null;
    this.flushDisarmWaiters();
    this.onGone(this);
  }
}
