/**
 * inproc data plane: a MessagePort between two NIC threads of one process, each holding the other's
 * SharedArrayBuffer slabs (handed over once, at handshake). The NIC of the engine that owns the grant
 * checks it and does the copy: the producer's NIC for a READ, the destination's NIC for a WRITE.
 *
 *   consumer NIC --{read}--> producer NIC: check grant, copy producer slab -> consumer slab --{done}--> consumer NIC
 *   consumer engine --{read}--> producer NIC: the same, answered to the engine (direct_link.ts)
 *
 * The second, direct port carries the work requests that need no fault of the local NIC: two thread
 * hops per request instead of four. Messages on a port are FIFO, so once a peer answers {aborted} (on
 * either port) it will not copy for that request.
 */
import type { MessagePort } from 'node:worker_threads';
import { COUNTER, asErrorCode, type WorkRequest } from '../nic/nic_messages.ts';
import type { NicContext } from '../nic/nic_worker.ts';
import { PACKED_STRIDE, sideOf } from '../core/ranges.ts';

export type LinkMessage =
  /** ranges packed as [requester's slab, its offset, server's slab, its offset, length]*n (packRanges). */
  | { t: 'read' | 'write'; reqId: number; transferId: string; token: string; ranges: Float64Array }
  | { t: 'done'; reqId: number }
  | { t: 'error'; reqId: number; code: string; message: string }
  | { t: 'abort'; reqId: number }
  | { t: 'aborted'; reqId: number };

export class InprocLink {
  private readonly peerSlabs: Uint8Array[];
  private readonly outstanding = new Set<number>();
  private readonly aborting = new Map<number, () => void>();
  private readonly closeHandlers: Array<() => void> = [];
  private closed = false;

  constructor(
    private readonly ctx: NicContext,
    private readonly peerEngineId: string,
    private readonly port: MessagePort,
    peerSlabs: SharedArrayBuffer[],
    /** Where the peer's engine posts straight to us (direct_link.ts); answered on the same port. */
    private readonly direct: MessagePort | null = null,
  ) {
    this.peerSlabs = peerSlabs.map((b) => new Uint8Array(b));
    port.on('message', (m: LinkMessage) => this.onMessage(m));
    port.on('close', () => this.close(`peer ${peerEngineId} closed its link`));
    direct?.on('message', (m: LinkMessage) => this.onDirect(m));
  }

  /** A request the peer's engine posted straight to us: served like the link's, answered to the engine. */
  private onDirect(m: LinkMessage): void {
    if (this.closed) return;
    if (m.t === 'read' || m.t === 'write') this.direct?.postMessage(this.serve(m));
    else if (m.t === 'abort') this.direct?.postMessage({ t: 'aborted', reqId: m.reqId } satisfies LinkMessage);
  }

  onClose(fn: () => void): void {
    this.closeHandlers.push(fn);
  }

  post(wr: WorkRequest): void {
    if (this.closed) {
      this.ctx.complete(wr.wrId, 'PEER_UNAVAILABLE', `link to peer ${this.peerEngineId} is closed`);
      return;
    }
    this.outstanding.add(wr.wrId);
    // A view of the host's shared ring (nic_host.ts): the peer reads it while the request is pending.
    this.send({ t: wr.kind, reqId: wr.wrId, transferId: wr.transferId, token: wr.grantToken, ranges: wr.ranges });
  }

  /** `ack` runs once the peer can no longer copy for this request. */
  abort(wrId: number, ack: () => void): void {
    if (this.closed || !this.outstanding.has(wrId)) return ack();
    this.aborting.set(wrId, ack);
    this.send({ t: 'abort', reqId: wrId });
  }

  close(reason: string): void {
    if (this.closed) return;
    this.closed = true;
    for (const wrId of this.outstanding) this.ctx.complete(wrId, 'PEER_UNAVAILABLE', reason);
    this.outstanding.clear();
    for (const ack of this.aborting.values()) ack();
    this.aborting.clear();
    this.port.close();
    this.direct?.close();
    for (const fn of this.closeHandlers) fn();
  }

  private send(m: LinkMessage): void {
    this.port.postMessage(m);
  }

  private onMessage(m: LinkMessage): void {
    if (this.closed) return;
    switch (m.t) {
      case 'read':
      case 'write':
        this.send(this.serve(m));
        return;
      case 'done':
      case 'error':
        if (!this.outstanding.delete(m.reqId)) return;
        if (m.t === 'done') this.ctx.complete(m.reqId, null, '');
        else this.ctx.complete(m.reqId, asErrorCode(m.code), m.message);
        return;
      case 'abort':
        this.send({ t: 'aborted', reqId: m.reqId });
        return;
      case 'aborted': {
        const ack = this.aborting.get(m.reqId);
        this.aborting.delete(m.reqId);
        this.outstanding.delete(m.reqId);
        ack?.();
        return;
      }
    }
  }

  /** A peer's READ of our pages or WRITE into our pages: check the grant here, then copy; the answer. */
  private serve(m: Extract<LinkMessage, { t: 'read' | 'write' }>): LinkMessage {
    const p = m.ranges;
    const d = this.ctx.checkGrant(this.peerEngineId, m.transferId, m.token, sideOf(p, 'remote'), m.reqId);
    if (!d.ok) return this.fail(m.reqId, 'GRANT_DENIED', `grant denied by ${this.ctx.engineId}: ${d.reason}`);
    const theirs = this.peerSlabs;
    for (let j = 0; j < p.length; j += PACKED_STRIDE) {
      const [slab, offset, length] = [p[j] as number, p[j + 1] as number, p[j + 4] as number];
      const slabLength = theirs[slab]?.length ?? -1;
      if (!Number.isSafeInteger(offset) || offset < 0 || offset + length > slabLength)
        return this.fail(m.reqId, 'BAD_TRANSFER_PARAMS', `peer range outside its own slab ${slab}`);
    }
    const read = m.t === 'read';
    this.copy(p, read);
    this.ctx.count(read ? COUNTER.readsServed : COUNTER.writesAccepted);
    return { t: 'done', reqId: m.reqId };
  }

  /**
   * The bench's inproc baseline: the copy a READ of `p` by the peer makes (serve's own copy), with no
   * grant, message or completion, on this thread and timed here: the copy's limit in the cache state
   * the served READ meets.
   */
  rawCopyMs(p: Float64Array): number {
    const t0 = performance.now();
    this.copy(p, true);
    return performance.now() - t0;
  }

  /** One copy per (coalesced) range, straight between the two engines' slabs: theirs <- ours for a READ. */
  private copy(p: Float64Array, read: boolean): void {
    const [ours, theirs] = [this.ctx.slabs, this.peerSlabs];
    for (let j = 0; j < p.length; j += PACKED_STRIDE) {
      const [theirSlab, theirOffset, ourSlab, ourOffset, length] = [
        p[j] as number,
        p[j + 1] as number,
        p[j + 2] as number,
        p[j + 3] as number,
        p[j + 4] as number,
      ];
      const [o, t] = [ours[ourSlab] as Uint8Array, theirs[theirSlab] as Uint8Array];
      if (read) t.set(o.subarray(ourOffset, ourOffset + length), theirOffset);
      else o.set(t.subarray(theirOffset, theirOffset + length), ourOffset);
    }
  }

  private fail(reqId: number, code: 'GRANT_DENIED' | 'BAD_TRANSFER_PARAMS', message: string): LinkMessage {
    return { t: 'error', reqId, code, message };
  }
}
