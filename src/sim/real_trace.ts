/**
 * Timelines of REAL runs (`handoff ab --trace`): the logs a threaded device and a transfer engine keep
 * when asked (the compute thread's op start/end, the host's NIC work-request post/completion) and the
 * race checker's reports, turned into the simulator's trace model (trace.ts), so the same Chrome
 * trace-event JSON and HTML page (trace_export.ts writeTrace) show them.
 *
 *   process <name>   host:    instants: op enqueued, work request posted
 *                    compute: ops as slices, [startMs, endMs] read in the compute thread
 *                    nic:     work requests as slices, post → completion as the HOST observed it
 *   process proxy    one slice per request (arrival → last token or error)
 *
 * All times are epoch ms on the clock every thread shares; the trace starts at the earliest of them.
 * A race report names its two accesses by the checker's op and work-request ids, which the logs
 * carry: both slices are highlighted and joined, as in simulated traces.
 */
import { assert } from '../util/assert.ts';
import type { RaceReport } from '../device/race/race_report.ts';
import type { TimedOp } from '../device/threaded_timeline.ts';
import type { WorkRequestRecord } from '../transfer/core/work_log.ts';
import { TraceRecorder, type SimTrace } from './trace.ts';

/** One request as the client side of the run saw it (epoch ms on the same clock). */
export interface RealRequest {
  index: number;
  startMs: number;
  endMs: number;
  outcome: string;
}

/** Everything one instance's timeline is built from. Plain data. */
export interface RealRunLog {
  title: string;
  /** Process name of the instance in the trace (e.g. 'D'). */
  process: string;
  ops: TimedOp[];
  workRequests: WorkRequestRecord[];
  requests: RealRequest[];
  races: RaceReport[];
}

/** Racing pairs highlighted at most (each pair is one flow arrow; the count of the rest is in the title). */
export const TRACE_RACE_PAIRS_MAX = 1000;

const opKey = (process: string, op: TimedOp): string => `${process}.op#${op.opId}`;
const wrKey = (process: string, wr: WorkRequestRecord): string => `${process}.wr#${wr.wrId}`;

function who(x: RaceReport['a']): string {
  const reqs = x.label.requestIds?.length ? ` (${x.label.requestIds.join(',')})` : '';
  const step = x.label.step === undefined ? '' : ` step ${x.label.step}`;
  return `${x.write ? 'write' : 'read'} by ${x.agent} ${x.label.what}${reqs}${step}`;
}

/** The earliest moment logged, where the trace starts (a loop, not Math.min(...): logs can be long). */
function traceOrigin(log: RealRunLog): number {
  let t0 = Infinity;
  for (const o of log.ops) t0 = Math.min(t0, o.enqueuedMs, o.startMs ?? Infinity);
  for (const w of log.workRequests) t0 = Math.min(t0, w.postedMs);
  for (const r of log.requests) t0 = Math.min(t0, r.startMs);
  return Number.isFinite(t0) ? t0 : 0;
}

/** Records every op (enqueue instant, compute slice); returns the slice keys by checker op id. */
function recordOps(rec: TraceRecorder, p: string, ops: TimedOp[], at: (ms: number) => number): Map<number, string> {
  const opByChecker = new Map<number, string>();
  for (const o of ops) {
    const key = opKey(p, o);
    if (o.checkerOpId !== null) opByChecker.set(o.checkerOpId, key);
    const args = {
      opId: o.opId,
      checkerOpId: o.checkerOpId,
      kind: o.kind,
      step: o.label.step,
      requests: o.label.requestIds,
      blocks: o.blockIds,
      state: o.state,
    };
    rec.instant({
      process: p,
      lane: 'host',
      name: `enqueue ${o.label.what}`,
      atMs: at(o.enqueuedMs),
      args: { key, step: o.label.step },
    });
    // An op that never ran (the run ended first) has no slice, only its enqueue.
    if (o.startMs === null || o.endMs === null) continue;
    assert(o.endMs >= o.startMs, `op ${o.opId} ends before it starts`);
    rec.span({
      key,
      process: p,
      lane: 'compute',
      name: o.label.what,
      startMs: at(o.startMs),
      durMs: o.endMs - o.startMs,
      args: { ...args, queuedMs: o.startMs - o.enqueuedMs },
    });
  }
  return opByChecker;
}

/** Records every work request (post instant, nic slice); returns the slice keys by checker work-request id. */
function recordWorkRequests(
  rec: TraceRecorder,
  p: string,
  workRequests: WorkRequestRecord[],
  at: (ms: number) => number,
): Map<number, string> {
  const wrByChecker = new Map<number, string>();
  for (const w of workRequests) {
    const key = wrKey(p, w);
    if (w.checkerWrId !== null) wrByChecker.set(w.checkerWrId, key);
    rec.instant({
      process: p,
      lane: 'host',
      name: `post ${w.kind} ${w.label.what}`,
      atMs: at(w.postedMs),
      args: { key, transferId: w.transferId },
    });
    if (w.doneMs === null) continue;
    assert(w.doneMs >= w.postedMs, `work request ${w.wrId} completes before it is posted`);
    rec.span({
      key,
      process: p,
      lane: 'nic',
      name: w.label.what,
      startMs: at(w.postedMs),
      durMs: w.doneMs - w.postedMs,
      args: {
        wrId: w.wrId,
        checkerWrId: w.checkerWrId,
        kind: w.kind,
        transferId: w.transferId,
        bytes: w.bytes,
        blocks: w.blockIds,
        requests: w.label.requestIds,
        state: w.state,
        completion: 'host-observed',
      },
    });
  }
  return wrByChecker;
}

/**
 * One highlight per racing pair of accesses, naming every page they both touch (like SimWorld.toTrace).
 * Returns the title suffix counting the pairs not shown ('' when all are).
 */
function markRaces(
  rec: TraceRecorder,
  p: string,
  races: RaceReport[],
  opByChecker: Map<number, string>,
  wrByChecker: Map<number, string>,
): string {
  const keyOf = (x: RaceReport['a']): string | null =>
    (x.source === 'op' ? opByChecker.get(x.id) : x.source === 'nic' ? wrByChecker.get(x.id) : undefined) ?? null;
  const pairs = new Map<string, { r: RaceReport; blocks: Set<number> }>();
  for (const r of races) {
    const k = `${r.a.source}${r.a.id}|${r.b.source}${r.b.id}`;
    const pair = pairs.get(k) ?? { r, blocks: new Set<number>() };
    pair.blocks.add(r.block);
    pairs.set(k, pair);
  }
  let shown = 0;
  for (const { r, blocks } of pairs.values()) {
    if (shown++ >= TRACE_RACE_PAIRS_MAX) break;
    const pages = [...blocks].sort((a, b) => a - b).join(',');
    rec.markRace(keyOf(r.a), keyOf(r.b), `${p}: ${who(r.a)} unordered with ${who(r.b)} on blocks ${pages}`);
  }
  return pairs.size > TRACE_RACE_PAIRS_MAX ? ` (${pairs.size - TRACE_RACE_PAIRS_MAX} more racing pairs not shown)` : '';
}

/** The run's timeline in the simulator's trace model. */
export function realTrace(log: RealRunLog): SimTrace {
  const p = log.process;
  assert(p !== 'proxy' && p.length > 0, `process name '${p}' is reserved or empty`);
  const origin = traceOrigin(log);
  const at = (ms: number): number => ms - origin;
  const rec = new TraceRecorder();
  const opByChecker = recordOps(rec, p, log.ops, at);
  const wrByChecker = recordWorkRequests(rec, p, log.workRequests, at);
  const more = markRaces(rec, p, log.races, opByChecker, wrByChecker);
  const requests = log.requests.map((r) => ({
    index: r.index,
    startMs: at(r.startMs),
    endMs: at(Math.max(r.endMs, r.startMs)),
    outcome: r.outcome,
  }));
  return rec.toTrace(`${log.title}${more}`, requests);
}
