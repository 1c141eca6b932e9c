/**
 * The compute stream of a device with tensor parallel ranks: one Stream for the host, fanned out over one
 * stream per rank (a worker thread each for `threaded`, a queue each for `sim`), as a TP executor
 * broadcasts each step to its ranks.
 *
 *   host --enqueue(op)--> RankedStream --rank 0's part--> compute.r0  (slabs [0, n/R))
 *                                      --rank 1's part--> compute.r1  (slabs [n/R, 2n/R))
 *
 * - zero / copy: each rank gets the slabs it owns (a rank owning none gets nothing; an op naming no slab
 *   at all goes to rank 0 as the no-op it is);
 * - kernel: every rank, the same args, its own part of the footprint (a gang: the ranks run it together,
 *   joined by the device's collective); the op's result is rank 0's;
 * - sleep: every rank (it holds the whole device).
 *
 * The race checker sees each rank's part on its rank's stream with that rank's footprint; the host
 * observing the op (awaiting its ticket) joins every part; an event joins every rank. Observers of this
 * stream see one op: enqueued once, executed when its last part has.
 */
import { assert } from '../util/assert.ts';
import { makeDeviceEvent, eventSource, type EventSource } from './device_event.ts';
import { observed } from './observed_promise.ts';
import { validateOp } from './page_ops.ts';
import type { InnerOp, StreamBase, StreamContext } from './stream_base.ts';
import type { DeviceEvent, OpSubmission, OpTicket, PageAccess, Stream, StreamObserver } from './types.ts';

/** Stream names of R ranks: 'compute' alone, else 'compute.r0' .. (what race reports and traces show). */
export function rankStreamName(base: string, rank: number, ranks: number): string {
  return ranks === 1 ? base : `${base}.r${rank}`;
}

export class RankedStream implements Stream {
  private observers: readonly StreamObserver[] | null = null;
  /** Parts not yet executed, per op of this stream. */
  private readonly unfinished = new Map<number, { left: number; ok: boolean }>();
  /** Rank op id -> this stream's op id. */
  private readonly parentOf = new Map<number, number>();
  private readonly slabsPerRank: number;

  constructor(
    readonly name: string,
    private readonly ctx: StreamContext,
    private readonly ranks: readonly StreamBase[],
  ) {
    assert(ranks.length >= 2, 'a ranked stream fans out over at least two ranks');
    assert(ctx.geometry.numSlabs % ranks.length === 0, 'every rank owns the same number of slabs');
    this.slabsPerRank = ctx.geometry.numSlabs / ranks.length;
    for (const r of ranks) r.observe({ enqueued: () => {}, executed: (id, ok) => this.partExecuted(id, ok) });
  }

  /** The rank that owns `slab`. */
  rankOf(slab: number): number {
    return Math.floor(slab / this.slabsPerRank);
  }

  enqueue(sub: OpSubmission): OpTicket {
    validateOp(sub.op, this.ctx.geometry);
    const id = this.ctx.nextOpId();
    const parts = this.split(sub);
    const gang = sub.op.kind === 'kernel';
    const inner: InnerOp[] = parts.map(([rank, part]) => {
      const op = (this.ranks[rank] as StreamBase).enqueueInner(part, { parent: id, gang });
      this.parentOf.set(op.id, id);
      return op;
    });
    this.unfinished.set(id, { left: inner.length, ok: true });
    const checker = this.ctx.checker;
    // Settled when every part has executed (a part that failed at once must not release the pages while
    // another rank still runs its part): the first failure, else rank 0's result.
    const all = Promise.allSettled(inner.map((o) => o.result)).then((results) => {
      const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
      if (failed !== undefined) throw failed.reason;
      return (results[0] as PromiseFulfilledResult<unknown>).value;
    });
    const done = observed(all, () => {
      if (checker !== null) for (const o of inner) if (o.checkerOpId !== null) checker.hostWaitOp(o.checkerOpId);
    });
    if (this.observers !== null) for (const o of this.observers) o.enqueued(sub, id);
    return { id, done };
  }

  /** Each rank's part of `sub`: [rank, its submission], in rank order. */
  private split(sub: OpSubmission): Array<[number, OpSubmission]> {
    const op = sub.op;
    const footprintOf = (rank: number): PageAccess[] | undefined =>
      sub.footprint?.filter((a) => this.rankOf(a.slab) === rank);
    const every = this.ranks.map((_, r) => r);
    if (op.kind === 'sleep') return every.map((r) => [r, sub]);
    if (op.kind === 'kernel') {
      return every.map((r) => {
        const footprint = footprintOf(r);
        return [r, footprint === undefined ? { op, label: sub.label } : { op, label: sub.label, footprint }];
      });
    }
    if (op.kind === 'zero-spans') {
      // A clipped tail lives on the ranks whose slabs hold it: each zeroes its own spans.
      const spanOwners = every.filter((r) => op.spans.some((sp) => this.rankOf(sp.slab) === r));
      if (spanOwners.length === 0) return [[0, sub]];
      return spanOwners.map((r) => {
        const part = { ...op, spans: op.spans.filter((sp) => this.rankOf(sp.slab) === r) };
        const footprint = footprintOf(r);
        return [
          r,
          footprint === undefined ? { op: part, label: sub.label } : { op: part, label: sub.label, footprint },
        ];
      });
    }
    const owners = every.filter((r) => op.slabs.some((s) => this.rankOf(s) === r));
    if (owners.length === 0) return [[0, sub]];
    return owners.map((r) => {
      const slabs = op.slabs.filter((s) => this.rankOf(s) === r);
      const footprint = footprintOf(r);
      const part = { ...op, slabs };
      return [r, footprint === undefined ? { op: part, label: sub.label } : { op: part, label: sub.label, footprint }];
    });
  }

  private partExecuted(rankOpId: number, ok: boolean): void {
    const id = this.parentOf.get(rankOpId);
    if (id === undefined) return;
    this.parentOf.delete(rankOpId);
    const u = this.unfinished.get(id);
    assert(u !== undefined, `op ${id} has a part but no record`);
    u.left--;
    u.ok &&= ok;
    if (u.left > 0) return;
    this.unfinished.delete(id);
    if (this.observers !== null) for (const o of this.observers) o.executed(id, u.ok);
  }

  recordEvent(): DeviceEvent {
    const checker = this.ctx.checker;
    const checkerEventId = checker === null ? null : checker.recordEventOn(this.ranks.map((r) => r.name));
    const sources = this.ranks.map((r) => r.recordInner());
    const reached = Promise.all(sources.map((s) => s.reached)).then(() => undefined);
    // catch-ok: only marks the rejection handled (a closed device); `reached` still rejects for whoever awaits it
    reached.catch(() => {});
    const source: EventSource = { reached, isReached: () => sources.every((s) => s.isReached()) };
    return makeDeviceEvent(this.ctx.nextEventId(), source, checker, checkerEventId);
  }

  waitEvent(ev: DeviceEvent): void {
    const checker = this.ctx.checker;
    const checkerEventId = checker?.eventIdOf(ev);
    if (checker !== null && checkerEventId !== undefined)
      for (const r of this.ranks) checker.streamWaitEvent(r.name, checkerEventId);
    const source = eventSource(ev);
    for (const r of this.ranks) r.waitInner(source);
  }

  observe(o: StreamObserver): () => void {
    assert(!(this.observers ?? []).includes(o), `observer already watches stream '${this.name}'`);
    this.observers = [...(this.observers ?? []), o];
    return () => {
      const rest = (this.observers ?? []).filter((x) => x !== o);
      this.observers = rest.length === 0 ? null : rest;
    };
  }
}
