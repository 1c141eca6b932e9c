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
 */
import type net from 'node:net';
import { encodeDataHeader } from './frame.ts';
import { RangeStream, type SideRanges } from '../core/ranges.ts';

/** Bytes handed to a socket but not yet flushed before the sender waits for 'drain'. */
export const SEND_HIGH_WATER = 8 << 20;

export class Sender {
  private readonly queue: Array<{ reqId: number; stream: RangeStream; onSent: () => void }> = [];
  private waiting = false;

  constructor(
    private readonly socket: net.Socket,
    private readonly slabs: readonly Uint8Array[],
    private readonly frameBytes: number,
  ) {}

  has(reqId: number): boolean {
    return this.queue.some((q) => q.reqId === reqId);
  }

  enqueue(reqId: number, ranges: SideRanges, onSent: () => void): void {
    this.queue.push({ reqId, stream: new RangeStream(ranges), onSent });
    this.pump();
  }

  cancel(reqId: number): void {
    const i = this.queue.findIndex((q) => q.reqId === reqId);
    if (i >= 0) this.queue.splice(i, 1);
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
      socket.write(encodeDataHeader(item.reqId, stream.expected, len));
      stream.advance(len, (slab, offset, _piece, seg) => {
        const s = this.slabs[slab] as Uint8Array;
        socket.write(new Uint8Array(s.buffer, s.byteOffset + offset, seg));
      });
      socket.uncork();
      if (stream.complete) {
        this.queue.shift();
        item.onSent();
      }
    }
  }
}
