/**
 * The engine thread's handle on its NIC thread: starts the worker, posts commands, owns the
 * completion-queue slots (one per work request in flight, bounded) and reads them with Atomics so
 * poll() sees a completion without a turn of the event loop.
 *
 * A crash of the NIC thread is a programmer error (an assertion failed there): it is rethrown here.
 */
import { MessageChannel, Worker, type MessagePort, type Transferable } from 'node:worker_threads';
import { assert } from '../../util/assert.ts';
import { HandoffError, listenFailed, type ErrorCode } from '../../util/errors.ts';
import { holdingLoopOpen } from '../../util/env.ts';
import {
  COUNTER,
  COUNTER_INTS,
  CQ_FREE,
  CQ_INTS_PER_SLOT,
  CQ_PENDING,
  ERROR_CODE_LIST,
  type NicCommand,
  type NicEvent,
  type NicInit,
} from './nic_messages.ts';
import type { GrantEnd, Nic, NicCompletionEvent, NicStats, NicWorkRequest } from '../core/nic.ts';
import type { SlabLayout } from '../core/types.ts';
import { RangeRing, type RingRegion } from './range_ring.ts';
import { DirectLink } from '../inproc/direct_link.ts';

export interface NicHostOptions {
  kind: 'inproc' | 'tcp';
  engineId: string;
  layout: SlabLayout;
  slabs: SharedArrayBuffer[];
  slotsMax: number;
  listenHost: string;
  dataPort: number;
  dataFrameBytes: number;
  recvDirectMinBytes: number;
  scatterRecv: boolean;
  lanes: number;
  laneMinBytes: number;
}

const CLOSE_GRACE_MS = 2000;
/** 2 MiB of ranges in flight through the ring (65536 descriptors), then copies. */
const RING_DOUBLES = 1 << 18;

export class NicHost implements Nic {
  private readonly cq: Int32Array;
  private readonly counters: Int32Array;
  private readonly freeSlots: number[] = [];
  private readonly listeners = new Set<(ev: NicEvent) => void>();
  private drains = 0;
  private closing: Promise<void> | null = null;
  private readonly ring = new RangeRing(RING_DOUBLES);
  private readonly directs = new Map<string, DirectLink>();
  /** The ring region of each completion slot's work request. */
  private readonly regions: Array<RingRegion | undefined> = [];

  private constructor(
    private readonly worker: Worker,
    private readonly control: MessagePort,
    cq: SharedArrayBuffer,
    counters: SharedArrayBuffer,
    readonly slotsMax: number,
    readonly dataPort: number,
  ) {
    this.cq = new Int32Array(cq);
    this.counters = new Int32Array(counters);
    for (let s = slotsMax - 1; s >= 0; s--) this.freeSlots.push(s);
    worker.on('message', (ev: NicEvent) => this.dispatch(ev));
  }

  static async start(o: NicHostOptions): Promise<NicHost> {
    assert(Number.isInteger(o.slotsMax) && o.slotsMax > 0 && o.slotsMax <= 1 << 16, 'slotsMax must be 1..65536');
    const cq = new SharedArrayBuffer(o.slotsMax * CQ_INTS_PER_SLOT * 4);
    const counters = new SharedArrayBuffer(COUNTER_INTS * 4);
    const { port1, port2 } = new MessageChannel();
    const init: NicInit = {
      kind: o.kind,
      engineId: o.engineId,
      layout: o.layout,
      slabs: o.slabs,
      cq,
      counters,
      control: port2,
      listenHost: o.listenHost,
      dataPort: o.dataPort,
      dataFrameBytes: o.dataFrameBytes,
      recvDirectMinBytes: o.recvDirectMinBytes,
      scatterRecv: o.scatterRecv,
      lanes: o.lanes,
      laneMinBytes: o.laneMinBytes,
    };
    const worker = new Worker(new URL('./nic_thread.mjs', import.meta.url), {
      workerData: init,
      transferList: [port2],
    });
    const dataPort = await new Promise<number>((resolve, reject) => {
      worker.once('error', (e) =>
        reject(
          e.message.includes('EADDRINUSE')
            ? listenFailed(e, o.listenHost, o.dataPort, 'KV data-plane')
            : new HandoffError('BAD_CONFIG', `NIC thread of ${o.engineId} failed to start: ${e.message}`),
        ),
      );
      worker.once('message', (ev: NicEvent) => {
        worker.removeAllListeners('error');
        assert(ev.t === 'ready', `NIC thread sent ${ev.t} before ready`);
        resolve(ev.dataPort);
      });
    });
    // From here on a NIC crash is a bug: let it take the process down with its message.
    worker.on('error', (e) => {
      throw e;
    });
    return new NicHost(worker, port1, cq, counters, o.slotsMax, dataPort);
  }

  send(cmd: NicCommand, transfer?: Transferable[]): void {
    if (this.closing !== null) return;
    this.control.postMessage(cmd, transfer);
  }

  post(wr: NicWorkRequest): void {
    const { label: _label, checkerWrId: _checkerWrId, ranges, ...rest } = wr;
    // The ranges go through the shared ring (a view costs a small message); a full ring: a copy.
    const slot = this.ring.alloc(ranges);
    if (slot !== null) this.regions[wr.slot] = slot.region;
    const view = slot?.view ?? ranges.slice();
    // inproc, no fault to play: straight to the peer's NIC (direct_link.ts).
    const direct = rest.delayMs === 0 && rest.failWith === null ? this.directs.get(wr.peerEngineId) : undefined;
    if (direct !== undefined) direct.post(rest, view);
    else this.send({ t: 'post', wr: { ...rest, ranges: view } });
  }

  abort(wrId: number): void {
    for (const d of this.directs.values()) if (d.abort(wrId)) return;
    this.send({ t: 'abort', wrId });
  }

  /** inproc: post to `peerEngineId`'s NIC over `port` from now on (work requests without faults). */
  attachDirect(peerEngineId: string, port: MessagePort): void {
    this.directs.get(peerEngineId)?.close(`link to ${peerEngineId} replaced`);
    this.directs.set(peerEngineId, new DirectLink(port, peerEngineId, (ev) => this.dispatch(ev)));
  }

  /** The peer is gone: its direct link fails what is pending. */
  detachDirect(peerEngineId: string, reason: string): void {
    this.directs.get(peerEngineId)?.close(reason);
    this.directs.delete(peerEngineId);
  }

  private dispatch(ev: NicEvent): void {
    for (const fn of [...this.listeners]) fn(ev);
  }

  observed(_wrId: number): void {}

  revokeGrant(transferId: string, _why: GrantEnd): void {
    this.send({ t: 'revoke', transferId });
  }

  drainGrant(transferId: string): Promise<void> {
    if (this.closing !== null) return Promise.resolve(); // a closing NIC stops touching memory
    const id = ++this.drains;
    return this.request({ t: 'drain', transferId, id }, (ev) =>
      (ev.t === 'drained' && ev.id === id) || ev.t === 'closed' ? true : undefined,
    ).then(() => undefined);
  }

  stats(): NicStats {
    return {
      grantsRefused: this.counter(COUNTER.grantsRefused),
      badFrames: this.counter(COUNTER.badFrames),
      scatterReads: this.counter(COUNTER.scatterReads),
      writesCut: this.counter(COUNTER.writesCut),
    };
  }

  /** Post a grant whose expiry is `ttlMs` from now, in a clock every thread shares. */
  grant(transferId: string, token: string, peerEngineId: string | null, blockIds: number[], ttlMs: number): void {
    const expiresAtEpochMs = this.nowEpochMs() + ttlMs;
    this.send({ t: 'grant', transferId, token, peerEngineId, blockIds, expiresAtEpochMs });
  }

  /** Epoch ms with sub-ms resolution: the clock every thread of the process shares (work-request log). */
  nowEpochMs(): number {
    return performance.timeOrigin + performance.now();
  }

  onEvent(fn: (ev: NicEvent) => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  onCompletion(fn: (ev: NicCompletionEvent) => void): () => void {
    return this.onEvent((ev) => {
      if (ev.t === 'cq' || ev.t === 'aborted') fn(ev);
    });
  }

  /** Post `cmd` and resolve with the first event `pick` accepts. */
  request<T>(cmd: NicCommand, pick: (ev: NicEvent) => T | undefined): Promise<T> {
    return new Promise((resolve) => {
      const off = this.onEvent((ev) => {
        const v = pick(ev);
        if (v === undefined) return;
        off();
        resolve(v);
      });
      this.send(cmd);
    });
  }

  /** A free completion slot marked pending, or null when slotsMax work requests are in flight. */
  allocSlot(): number | null {
    const s = this.freeSlots.pop();
    if (s === undefined) return null;
    Atomics.store(this.cq, s * CQ_INTS_PER_SLOT, CQ_PENDING);
    return s;
  }

  freeSlot(slot: number): void {
    assert(Atomics.load(this.cq, slot * CQ_INTS_PER_SLOT) !== CQ_FREE, `slot ${slot} freed twice`);
    // The work request ended: its NIC no longer reads its ranges.
    const region = this.regions[slot];
    if (region !== undefined) {
      this.ring.release(region);
      delete this.regions[slot];
    }
    Atomics.store(this.cq, slot * CQ_INTS_PER_SLOT, CQ_FREE);
    this.freeSlots.push(slot);
  }

  /** CQ_PENDING, CQ_DONE or CQ_FAILED, with the error code when failed. */
  slotState(slot: number): { state: number; code: ErrorCode } {
    const state = Atomics.load(this.cq, slot * CQ_INTS_PER_SLOT);
    const code = ERROR_CODE_LIST[Atomics.load(this.cq, slot * CQ_INTS_PER_SLOT + 1)] ?? 'TRANSFER_FAILED';
    return { state, code };
  }

  counter(index: number): number {
    return Atomics.load(this.counters, index);
  }

  close(): Promise<void> {
    this.closing ??= (async () => {
      let answered = false;
      const closed = new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, CLOSE_GRACE_MS);
        const off = this.onEvent((ev) => {
          if (ev.t !== 'closed') return;
          answered = true;
          off();
          clearTimeout(timer);
          resolve();
        });
      });
      for (const [peer] of this.directs) this.detachDirect(peer, 'the local NIC was closed');
      this.control.postMessage({ t: 'close' } satisfies NicCommand);
      await closed;
      this.worker.removeAllListeners('error');
      await holdingLoopOpen(this.worker.terminate());
      // A thread that never answered (past the grace) is gone now: what waits for its 'closed' (a drain)
      // is told here, or it would wait for good.
      if (!answered) this.dispatch({ t: 'closed' });
      this.control.close();
    })();
    return this.closing;
  }
}
