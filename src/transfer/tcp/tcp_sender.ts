/**
 * Streams transfers' bytes from our slabs as DATA frames on one connection, in the order they were
 * queued (a READ reply or a WRITE's payload), one transfer at a time.
 *
 *   queue: [req 7: RangeStream] [req 9: RangeStream] ...
 *   frame: | header 17 B | segment views of the slabs (zero-copy), up to frameBytes |   corked: one writev
 *
 * Back-pressure without stalls: frames are handed to the socket while less than SEND_HIGH_WATER bytes
 * wait in it (write()'s false at Node's 16 KiB highWaterMark would stop a 1 MiB frame at every write and
 * leave the kernel idle while we wait for 'drain'); past it we wait for 'drain', once.
 *
 * drained(transferId): the slabs are read until the kernel took the bytes, which may be long after a
 * frame was handed to the socket (Node keeps the views queued while the peer is slow). Each stream counts
 * as unflushed from enqueue until an empty write behind its last bytes (or behind what a cancel left
 * written) calls back; drained settles once none of the transfer's streams is unflushed, or the socket
 * is gone.
 */
import type net from 'node:net';
import { encodeDataHeader } from './frame.ts';
import { RangeStream, type SideRanges } from '../core/ranges.ts';

/** Bytes handed to a socket but not yet flushed before the sender waits for 'drain'. */
export const SEND_HIGH_WATER = 8 << 20;

const EMPTY = new Uint8Array(0);

interface Item {
  reqId: number;
  transferId: string;
  stream: RangeStream;
  onSent: () => void;
}

export class Sender {
  private readonly queue: Item[] = [];
  /** Per transfer: its streams queued, or written and not yet flushed to the kernel. */
  private readonly unflushed = new Map<string, number>();
  private readonly drains: Array<{ transferId: string; done: () => void }> = [];
  private waiting = false;

  constructor(
    private readonly socket: net.Socket,
    private readonly slabs: readonly Uint8Array[],
    private readonly frameBytes: number,
    /** Runs each time the kernel took a frame's first bytes (the connection moves). */
    private readonly onMoved: () => void = () => {},
  ) {
    socket.once('close', () => {
      this.unflushed.clear();
      this.checkDrains();
    });
  }

  /** Settles once the socket no longer reads `transferId`'s pages (see above). */
  drained(transferId: string): Promise<void> {
    return new Promise((done) => {
      this.drains.push({ transferId, done });
      this.checkDrains();
    });
  }

  has(reqId: number): boolean {
    return this.queue.some((q) => q.reqId === reqId);
  }

  enqueue(reqId: number, transferId: string, ranges: SideRanges, onSent: () => void): void {
    this.queue.push({ reqId, transferId, stream: new RangeStream(ranges), onSent });
    this.unflushed.set(transferId, (this.unflushed.get(transferId) ?? 0) + 1);
    this.pump();
  }

  cancel(reqId: number): void {
    const i = this.queue.findIndex((q) => q.reqId === reqId);
    if (i < 0) return;
    const [item] = this.queue.splice(i, 1) as [Item];
    // Frames of it already written may still wait in Node: flushed once an empty write behind them is.
    if (item.stream.expected === 0 || this.socket.destroyed) this.flushed(item.transferId);
    else this.socket.write(EMPTY, () => this.flushed(item.transferId));
  }

  /** One stream of `transferId` no longer reads the slabs (its last write completed, or failed). */
  private flushed(transferId: string): void {
    const n = (this.unflushed.get(transferId) ?? 1) - 1;
    if (n > 0) this.unflushed.set(transferId, n);
    else this.unflushed.delete(transferId);
    if (this.drains.length > 0) this.checkDrains();
  }

  private checkDrains(): void {
    for (const d of [...this.drains]) {
      if (!this.socket.destroyed && this.unflushed.has(d.transferId)) continue;
      this.drains.splice(this.drains.indexOf(d), 1);
      d.done();
    }
  }

  private pump(): void {
    const socket = this.socket;
    while (this.queue.length > 0 && !socket.destroyed) {
      if (socket.writableLength >= SEND_HIGH_WATER) {
        if (!this.waiting) {
          this.waiting = true;
          socket.once('drain', () => {
            this.waiting = false;
            this.pump();
          });
        }
        return;
      }
      const item = this.queue[0];
      if (item === undefined) return;
      const { stream } = item;
      const len = Math.min(this.frameBytes, stream.total - stream.expected);
      socket.cork();
      socket.write(encodeDataHeader(item.reqId, stream.expected, len), this.onMoved);
      stream.advance(len, (slab, offset, _piece, seg) => {
        const s = this.slabs[slab] as Uint8Array;
        socket.write(new Uint8Array(s.buffer, s.byteOffset + offset, seg));
      });
      const last = stream.complete;
      // Behind the stream's last bytes, an empty write whose callback runs once they are flushed (writes
      // complete in order; called with an error when the socket is destroyed first: nothing reads them then).
      if (last) socket.write(EMPTY, () => this.flushed(item.transferId));
      socket.uncork();
      if (last) {
        this.queue.shift();
        item.onSent();
      }
    }
  }
}
