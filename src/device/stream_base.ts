/**
 * The host side of a stream, shared by both devices: checks each op, derives its footprint, tells
 * the race checker, and hands out tickets and events. Subclasses decide how items reach the executor
 * (a worker thread for `threaded`, a local queue for `sim`).
 *
 * Enqueue never blocks: it validates, records, hands the item over, and returns.
 *
 * Observers (`observe`) hear of every op enqueued and executed; with none the cost is one null check.
 */
import { assert } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';
import { Deferred } from './deferred.ts';
import { eventSource, makeDeviceEvent, type EventSource } from './device_event.ts';
import { observed } from './observed_promise.ts';
import { opFootprint, validateOp, type SlabGeometry } from './page_ops.ts';
import type { RaceChecker } from './race/race_checker.ts';
import type { DeviceEvent, OpSubmission, OpTicket, Stream, StreamObserver } from './types.ts';

/** What every stream of one device shares. */
export interface StreamContext {
  geometry: SlabGeometry;
  checker: RaceChecker | null;
  /** Ticket ids, unique over the device's streams. */
  nextOpId(): number;
  nextEventId(): number;
}

/** Ops (and waits) queued on one stream and not yet executed. */
export const STREAM_PENDING_MAX = 65_536;

/** A rank's part of an op enqueued on a RankedStream (ranked_stream.ts): that op's id, and whether it is a gang. */
export interface OpLink {
  parent: number;
  /** Every rank runs this op together (a kernel): the sim device runs the ranks' parts as one. */
  gang: boolean;
}

/** An op handed to the executor without a host-observed ticket (RankedStream builds its own). */
export interface InnerOp {
  id: number;
  /** The race checker's id of the op, null without a checker. */
  checkerOpId: number | null;
  result: Promise<unknown>;
}

export abstract class StreamBase implements Stream {
  protected closed = false;
  /**
   * Why the executor is gone (its thread died), when it is: later items are refused with this operating error.
   * A stream the host closed itself refuses them with an AssertionFailure (using a closed device is a bug).
   */
  private lostWith: HandoffError | null = null;
  /** Copy-on-write list; null when nobody observes. */
  private observers: readonly StreamObserver[] | null = null;

  constructor(
    readonly name: string,
    protected readonly ctx: StreamContext,
  ) {
    ctx.checker?.addStream(name);
  }

  enqueue(sub: OpSubmission): OpTicket {
    const { id, checkerOpId, result } = this.enqueueInner(sub);
    const checker = this.ctx.checker;
    const done = observed(result, () => {
      if (checker !== null && checkerOpId !== null) checker.hostWaitOp(checkerOpId);
    });
    return { id, done };
  }

  /**
   * Validate, tell the checker and the observers, and hand the op over; the caller decides when the host
   * observes its completion (enqueue wraps `result` in a ticket, a RankedStream joins its ranks' first).
   */
  enqueueInner(sub: OpSubmission, link?: OpLink): InnerOp {
    this.checkOpen('enqueue');
    const { geometry, checker } = this.ctx;
    validateOp(sub.op, geometry);
    const footprint = opFootprint(sub.op, sub.footprint, geometry);
    if (checker !== null) {
      // Invariant: with the checker on, a kernel without a declared footprint would be invisible to it.
      assert(sub.op.kind !== 'kernel' || sub.footprint !== undefined, `kernel '${sub.label.what}' has no footprint`);
    }
    const checkerOpId = checker === null ? null : checker.hostEnqueue(this.name, sub.label, footprint);
    const id = this.ctx.nextOpId();
    const result = new Deferred<unknown>();
    this.submitOp(id, sub, result, link);
    if (this.observers !== null) for (const o of this.observers) o.enqueued(sub, id);
    return { id, checkerOpId, result: result.promise };
  }

  /** The executor's view of an event recorded now (no checker event: the caller records one over its ranks). */
  recordInner(): EventSource {
    this.checkOpen('recordEvent');
    return this.submitRecord();
  }

  /** Later items wait for `source` (no checker edge: the caller adds it). */
  waitInner(source: EventSource): void {
    this.checkOpen('waitEvent');
    this.submitWait(source);
  }

  /** The executor died: fail everything pending with `err`, and refuse later items with it. */
  lose(err: HandoffError): void {
    this.lostWith = err;
    this.fail(err);
  }

  private checkOpen(what: string): void {
    if (this.lostWith !== null) throw new HandoffError(this.lostWith.code, this.lostWith.message);
    assert(!this.closed, `${what} on closed stream '${this.name}'`);
  }

  observe(o: StreamObserver): () => void {
    assert(!(this.observers ?? []).includes(o), `observer already watches stream '${this.name}'`);
    this.observers = [...(this.observers ?? []), o];
    return () => {
      const rest = (this.observers ?? []).filter((x) => x !== o);
      this.observers = rest.length === 0 ? null : rest;
    };
  }

  /** The executor finished op `id`; call before settling its ticket. */
  protected notifyExecuted(id: number, ok: boolean): void {
    if (this.observers !== null) for (const o of this.observers) o.executed(id, ok);
  }

  recordEvent(): DeviceEvent {
    this.checkOpen('recordEvent');
    const checker = this.ctx.checker;
    const checkerEventId = checker === null ? null : checker.recordEvent(this.name);
    return makeDeviceEvent(this.ctx.nextEventId(), this.submitRecord(), checker, checkerEventId);
  }

  waitEvent(ev: DeviceEvent): void {
    this.checkOpen('waitEvent');
    const checker = this.ctx.checker;
    // An event the checker does not know (a foreign object) adds no edge: it can only cause a false
    // report, never hide a race.
    const checkerEventId = checker?.eventIdOf(ev);
    if (checker !== null && checkerEventId !== undefined) checker.streamWaitEvent(this.name, checkerEventId);
    this.submitWait(eventSource(ev));
  }

  /** Hand an op to the executor; settle `result` when it has executed. */
  protected abstract submitOp(id: number, sub: OpSubmission, result: Deferred<unknown>, link?: OpLink): void;
  /** Mark the current end of the stream; the source is reached when everything before it executed. */
  protected abstract submitRecord(): EventSource;
  /** Later items wait until `source` is reached. */
  protected abstract submitWait(source: EventSource): void;
  /** Close: reject every pending ticket and event with `err`. */
  abstract fail(err: unknown): void;
}
