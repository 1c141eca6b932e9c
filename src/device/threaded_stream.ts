/**
 * Host side of a stream executed by a worker thread. Enqueue posts a small message and returns;
 * the thread reports each executed item back (`done`/`failed` with its seq), which settles the
 * ticket and reaches every event recorded at or before that seq.
 *
 * Events: an event recorded now is reached when the item with the current last seq has executed
 * (visible at once through the shared progress counter, and as a message). A wait on one of this
 * stream's own events is satisfied by FIFO order and sends nothing; a wait on any other event sends
 * a `wait` item that holds the thread until the host signals that the event was reached.
 */
import type { Worker } from 'node:worker_threads';
import { assert, AssertionFailure } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';
import { Deferred } from './deferred.ts';
import type { EventSource } from './device_event.ts';
import { STREAM_PENDING_MAX, StreamBase, type StreamContext } from './stream_base.ts';
import type { FromThread, ToThread } from './threaded_protocol.ts';
import type { OpTimeline } from './threaded_timeline.ts';
import type { OpSubmission } from './types.ts';

export class ThreadedStream extends StreamBase {
  private lastSeq = 0;
  private lastDoneSeq = 0;
  /** Op tickets by seq (waits have none). */
  private readonly tickets = new Map<number, { id: number; result: Deferred<unknown> }>();
  /** Recorded events not yet reached, in increasing `target` order. */
  private records: Array<{ target: number; reached: Deferred<void> }> = [];
  private readonly ownSources = new WeakSet<EventSource>();
  private nextToken = 0;
  /** The opt-in op log (set by the device's startTimeline); null: ops are sent untimed. */
  timeline: OpTimeline | null = null;

  constructor(
    name: string,
    ctx: StreamContext,
    private readonly worker: Worker,
    private readonly progress: BigInt64Array,
    /** The race checker's id of the op being submitted (StreamBase tells the checker first). */
    private readonly checkerOpId: () => number | null = () => null,
  ) {
    super(name, ctx);
  }

  protected submitOp(id: number, sub: OpSubmission, result: Deferred<unknown>): void {
    const seq = this.nextSeq();
    const timed = this.timeline?.record(seq, id, this.checkerOpId(), this.name, sub) === true;
    try {
      this.send(timed ? { t: 'op', seq, op: sub.op, timed: true } : { t: 'op', seq, op: sub.op });
      // catch-ok: only postMessage runs in the try; a DataCloneError is turned into the AssertionFailure it is
    } catch (err) {
      // The op never reached the thread: it must not hold a seq (events behind it would never be reached).
      this.lastSeq--;
      this.timeline?.unrecord(seq);
      if (this.pending() === 0) this.worker.unref();
      // Kernel args must be plain data; anything else is a programmer error, not an op failure.
      throw new AssertionFailure(
        `op '${sub.label.what}' cannot be sent to the compute thread: ${(err as Error).message}`,
      );
    }
    this.tickets.set(seq, { id, result });
  }

  protected submitRecord(): EventSource {
    const target = this.lastSeq;
    const reached = new Deferred<void>();
    if (this.executedSeq() >= target) reached.resolve();
    else this.records.push({ target, reached });
    const source: EventSource = {
      reached: reached.promise,
      isReached: () => reached.done || this.executedSeq() >= target,
    };
    this.ownSources.add(source);
    return source;
  }

  protected submitWait(source: EventSource): void {
    if (this.ownSources.has(source) || source.isReached()) return;
    const token = ++this.nextToken;
    this.send({ t: 'wait', seq: this.nextSeq(), token });
    // A source that fails (its device closed) releases the wait rather than wedging the stream.
    const signal = (): void => {
      if (!this.closed) this.worker.postMessage({ t: 'signal', token } satisfies ToThread);
    };
    source.reached.then(signal, signal);
  }

  /** A message from the thread about this stream's items. */
  onMessage(msg: FromThread): void {
    if (msg.t !== 'done' && msg.t !== 'failed') return;
    assert(msg.seq > this.lastDoneSeq && msg.seq <= this.lastSeq, `out-of-order completion seq ${msg.seq}`);
    this.lastDoneSeq = msg.seq;
    if (msg.startMs !== undefined && msg.endMs !== undefined)
      this.timeline?.complete(msg.seq, msg.startMs, msg.endMs, msg.t === 'done');
    const ticket = this.tickets.get(msg.seq);
    this.tickets.delete(msg.seq);
    if (ticket !== undefined) this.notifyExecuted(ticket.id, msg.t === 'done');
    if (msg.t === 'done') ticket?.result.resolve(msg.result);
    else ticket?.result.reject(new HandoffError('INTERNAL', msg.message));
    let reachedCount = 0;
    while (reachedCount < this.records.length && (this.records[reachedCount]?.target ?? Infinity) <= msg.seq) {
      this.records[reachedCount]?.reached.resolve();
      reachedCount++;
    }
    if (reachedCount > 0) this.records = this.records.slice(reachedCount);
  }

  /** Items posted and not yet reported executed. */
  pending(): number {
    return this.lastSeq - this.lastDoneSeq;
  }

  fail(err: unknown): void {
    this.closed = true;
    for (const t of this.tickets.values()) t.result.reject(err);
    this.tickets.clear();
    for (const r of this.records) r.reached.reject(err);
    this.records = [];
  }

  private executedSeq(): number {
    return Number(Atomics.load(this.progress, 0));
  }

  private nextSeq(): number {
    assert(this.pending() < STREAM_PENDING_MAX, `stream '${this.name}' has ${STREAM_PENDING_MAX} items pending`);
    return ++this.lastSeq;
  }

  private send(msg: ToThread): void {
    this.worker.ref();
    this.worker.postMessage(msg);
  }
}
