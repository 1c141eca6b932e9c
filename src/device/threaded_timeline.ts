/**
 * Opt-in op log of the threaded compute stream, for timelines of real runs (`handoff ab --trace`).
 *
 *   host: enqueue ──op{seq, timed}──> compute thread: startMs … run … endMs ──done{seq, startMs, endMs}──> host
 *
 * Times are epoch milliseconds from `performance.timeOrigin + performance.now()`, read where the thing
 * happens (enqueue on the host, start and end in the compute thread), so they share one clock across
 * threads and with the NIC host's log (src/transfer). Off by default: when off, ops carry no flag and
 * the thread reads no clock. Bounded: past OPS_MAX ops nothing more is logged (counted in `dropped`).
 */
import { assert } from '../util/assert.ts';
import { RaceChecker } from './race/race_checker.ts';
import { epochNowMs } from './threaded_protocol.ts';
import type { OpLabel, OpSubmission, PageAccess } from './types.ts';

/** One op of the compute stream as it really ran. Plain data. */
export interface TimedOp {
  /** The op's ticket id (OpTicket.id). */
  opId: number;
  /** The race checker's id for the op (RaceReport access `id` with source 'op'); null without checker. */
  checkerOpId: number | null;
  stream: string;
  label: OpLabel;
  /** 'zero', 'copy', 'sleep' or 'kernel <name>'. */
  kind: string;
  /** Pages a zero op clears (empty for other ops). */
  blockIds: number[];
  /** Host clock when enqueued. */
  enqueuedMs: number;
  /** Compute thread's clock around the op; null while it has not run. */
  startMs: number | null;
  endMs: number | null;
  state: 'queued' | 'done' | 'failed';
}

export const TIMELINE_OPS_MAX = 100_000;

export class OpTimeline {
  private readonly ops: TimedOp[] = [];
  private readonly bySeq = new Map<number, TimedOp>();
  dropped = 0;

  /** Log an op about to be sent as stream item `seq`; false when the log is full (the op is sent untimed). */
  record(seq: number, opId: number, checkerOpId: number | null, stream: string, sub: OpSubmission): boolean {
    if (this.ops.length >= TIMELINE_OPS_MAX) {
      this.dropped++;
      return false;
    }
    const op = sub.op;
    const entry: TimedOp = {
      opId,
      checkerOpId,
      stream,
      label: { ...sub.label, ...(sub.label.requestIds ? { requestIds: [...sub.label.requestIds] } : {}) },
      kind: op.kind === 'kernel' ? `kernel ${op.name}` : op.kind,
      blockIds:
        op.kind === 'zero'
          ? [...op.blockIds]
          : op.kind === 'zero-spans'
            ? [...new Set(op.spans.map((s) => s.block))]
            : [],
      enqueuedMs: epochNowMs(),
      startMs: null,
      endMs: null,
      state: 'queued',
    };
    this.ops.push(entry);
    this.bySeq.set(seq, entry);
    return true;
  }

  /** Forget the entry just recorded for `seq`: its op was never sent. */
  unrecord(seq: number): void {
    const entry = this.bySeq.get(seq);
    if (entry === undefined) return;
    this.bySeq.delete(seq);
    assert(this.ops[this.ops.length - 1] === entry, `op log entry of seq ${seq} is not the last`);
    this.ops.pop();
  }

  /** The thread reported item `seq` executed between startMs and endMs. */
  complete(seq: number, startMs: number, endMs: number, ok: boolean): void {
    const entry = this.bySeq.get(seq);
    if (entry === undefined) return;
    this.bySeq.delete(seq);
    // Invariant: the thread reads its clock before and after the op, and that clock is monotonic.
    assert(endMs >= startMs, `op ${entry.opId} ended (${endMs}) before it started (${startMs})`);
    entry.startMs = startMs;
    entry.endMs = endMs;
    entry.state = ok ? 'done' : 'failed';
  }

  /** A copy of the log, in enqueue order. */
  entries(): TimedOp[] {
    return this.ops.map((o) => ({ ...o, label: { ...o.label }, blockIds: [...o.blockIds] }));
  }
}

/**
 * A race checker that remembers the id it gave the last enqueued op, so the op log can name ops the
 * way race reports do (ticket ids and checker ids are numbered separately).
 */
export class OpIdRaceChecker extends RaceChecker {
  lastOpId: number | null = null;

  override hostEnqueue(stream: string, label: OpLabel, footprint: readonly PageAccess[]): number {
    this.lastOpId = super.hostEnqueue(stream, label, footprint);
    return this.lastOpId;
  }
}
