/**
 * A simulated stream: a FIFO of ops, event records and waits that executes nothing on its own.
 * Records and satisfied waits at the head are consumed by settle(); an op at the head is "ready" and
 * runs only when the simulator (SimDevice.runOp) says so.
 *
 *   queue: [ wait(ev from elsewhere) | op 7 | record e3 | op 9 ]
 *            ^ head: blocks until ev is reached, then op 7 becomes ready
 */
import { assert } from '../util/assert.ts';
import { Deferred } from './deferred.ts';
import type { EventSource } from './device_event.ts';
import { STREAM_PENDING_MAX, StreamBase, type OpLink, type StreamContext } from './stream_base.ts';
import type { OpSubmission } from './types.ts';

export interface SimOpItem {
  type: 'op';
  id: number;
  sub: OpSubmission;
  result: Deferred<unknown>;
  /** Set when the op is one rank's part of an op of a RankedStream. */
  link: OpLink | null;
}

type SimItem =
  SimOpItem | { type: 'record'; reached: Deferred<void> } | { type: 'wait'; source: EventSource; released: boolean };

export class SimStream extends StreamBase {
  private queue: Array<SimItem | undefined> = [];
  private headIndex = 0;
  /** An op taken from the head still runs (a kernel's promise): nothing behind it moves until it ends. */
  running = false;

  /** `onChange` is called when something may have become ready (for autoRun). */
  constructor(
    name: string,
    ctx: StreamContext,
    private readonly onChange: () => void,
  ) {
    super(name, ctx);
  }

  protected submitOp(id: number, sub: OpSubmission, result: Deferred<unknown>, link?: OpLink): void {
    this.push({ type: 'op', id, sub, result, link: link ?? null });
  }

  protected submitRecord(): EventSource {
    const reached = new Deferred<void>();
    if (this.pending() === 0) reached.resolve();
    else this.push({ type: 'record', reached });
    return { reached: reached.promise, isReached: () => reached.done };
  }

  protected submitWait(source: EventSource): void {
    if (source.isReached()) return;
    const item: SimItem = { type: 'wait', source, released: false };
    // A source that fails (its device closed) releases the wait rather than wedging the stream.
    const release = (): void => {
      item.released = true;
      this.onChange();
    };
    source.reached.then(release, release);
    this.push(item);
  }

  /** Consume records and satisfied waits at the head. Returns true if anything changed. */
  settle(): boolean {
    let changed = false;
    if (this.running) return false;
    for (;;) {
      const item = this.queue[this.headIndex];
      if (item === undefined || item.type === 'op') break;
      if (item.type === 'wait' && !item.released && !item.source.isReached()) break;
      if (item.type === 'record') item.reached.resolve();
      this.pop();
      changed = true;
    }
    return changed;
  }

  /** The op at the head, if the head is an op (call settle() first). */
  head(): SimOpItem | null {
    const item = this.queue[this.headIndex];
    return !this.running && item !== undefined && item.type === 'op' ? item : null;
  }

  /** Remove the head op, which the device is about to execute. */
  takeHead(id: number): SimOpItem {
    const item = this.head();
    assert(item !== null && item.id === id, `op ${id} is not at the head of stream '${this.name}'`);
    this.pop();
    return item;
  }

  /** The device executed op `id` (taken with takeHead): tell the observers. */
  executed(id: number, ok: boolean): void {
    this.notifyExecuted(id, ok);
  }

  pending(): number {
    return this.queue.length - this.headIndex + (this.running ? 1 : 0);
  }

  fail(err: unknown): void {
    this.closed = true;
    for (let i = this.headIndex; i < this.queue.length; i++) {
      const item = this.queue[i];
      if (item?.type === 'op') item.result.reject(err);
      if (item?.type === 'record') item.reached.reject(err);
    }
    this.queue = [];
    this.headIndex = 0;
  }

  private push(item: SimItem): void {
    assert(this.pending() < STREAM_PENDING_MAX, `stream '${this.name}' has ${STREAM_PENDING_MAX} items pending`);
    this.queue.push(item);
    this.onChange();
  }

  private pop(): void {
    this.queue[this.headIndex] = undefined;
    this.headIndex++;
    if (this.headIndex > 1024 && this.headIndex * 2 > this.queue.length) {
      this.queue = this.queue.slice(this.headIndex);
      this.headIndex = 0;
    }
  }
}
