/**
 * Traces of a simulated run: what ran where and when, as Chrome trace-event JSON (loadable in
 * Perfetto, chrome://tracing and speedscope) and as the input of the HTML timeline (timeline_html.ts).
 *
 *   process "proxy"    one async slice per request (arrive → done/failed)
 *   process "P", "D"   threads: host (instants: zero/forward enqueued, READ posted, notify),
 *                      compute (ops as slices), nic (work requests and notifications as slices)
 *
 * The racing pair the race checker reports is highlighted: both slices get `args.race` and the
 * reserved colour "terrible", and a flow arrow joins them.
 */
export const LANES = ['host', 'compute', 'nic'] as const;
export type LaneKind = (typeof LANES)[number];

export interface TraceSpan {
  key: string;
  process: string;
  lane: LaneKind | 'proxy';
  name: string;
  startMs: number;
  durMs: number;
  args: Record<string, unknown>;
  race: string | null;
}

export interface TraceInstant {
  process: string;
  lane: LaneKind | 'proxy';
  name: string;
  atMs: number;
  args: Record<string, unknown>;
}

/** Plain data: everything a timeline needs. */
export interface SimTrace {
  title: string;
  spans: TraceSpan[];
  instants: TraceInstant[];
  requests: Array<{ index: number; startMs: number; endMs: number; outcome: string }>;
  races: Array<{ a: string | null; b: string | null; text: string }>;
}

const SPANS_MAX = 200_000;

export class TraceRecorder {
  readonly spans: TraceSpan[] = [];
  readonly instants: TraceInstant[] = [];
  private readonly byKey = new Map<string, TraceSpan>();
  readonly races: SimTrace['races'] = [];

  span(s: Omit<TraceSpan, 'race'>): void {
    if (this.spans.length >= SPANS_MAX) return;
    const full = { ...s, race: null };
    this.spans.push(full);
    this.byKey.set(s.key, full);
  }

  instant(i: TraceInstant): void {
    if (this.instants.length < SPANS_MAX) this.instants.push(i);
  }

  /** Highlight the two accesses of a race (keys of recorded spans; either may be unknown). */
  markRace(a: string | null, b: string | null, text: string): void {
    for (const k of [a, b]) {
      const s = k === null ? undefined : this.byKey.get(k);
      if (s !== undefined) s.race = text;
    }
    this.races.push({ a, b, text });
  }

  toTrace(title: string, requests: SimTrace['requests']): SimTrace {
    return { title, spans: this.spans, instants: this.instants, requests, races: this.races };
  }
}

const US = 1000;

type TraceEvent = Record<string, unknown>;
type PidOf = (process: string) => number;
type TidOf = (lane: string) => number;

/** Process and thread name events: one process per trace process, one thread per lane. */
function nameEvents(processes: string[], pid: PidOf, tid: TidOf): TraceEvent[] {
  const ev: TraceEvent[] = [];
  for (const p of processes) {
    ev.push({
      ph: 'M',
      name: 'process_name',
      pid: pid(p),
      tid: 0,
      args: { name: p === 'proxy' ? 'proxy' : p === 'P' ? 'P (prefill)' : p === 'D' ? 'D (decode)' : p },
    });
    for (const lane of p === 'proxy' ? ['proxy'] : LANES)
      ev.push({ ph: 'M', name: 'thread_name', pid: pid(p), tid: tid(lane), args: { name: lane } });
  }
  return ev;
}

/** Appends one flow arrow per race whose two slices are both in the trace. */
function pushRaceFlows(ev: TraceEvent[], t: SimTrace, pid: PidOf, tid: TidOf): void {
  t.races.forEach((r, n) => {
    const a = t.spans.find((s) => s.key === r.a);
    const b = t.spans.find((s) => s.key === r.b);
    if (a === undefined || b === undefined) return;
    ev.push({
      ph: 's',
      id: n + 1,
      name: 'race',
      cat: 'race',
      pid: pid(a.process),
      tid: tid(a.lane),
      ts: a.startMs * US,
    });
    ev.push({
      ph: 'f',
      bp: 'e',
      id: n + 1,
      name: 'race',
      cat: 'race',
      pid: pid(b.process),
      tid: tid(b.lane),
      ts: b.startMs * US,
    });
  });
}

/** Chrome trace-event format (JSON object form). */
export function toChromeTrace(t: SimTrace): {
  traceEvents: Array<Record<string, unknown>>;
  displayTimeUnit: 'ms';
  metadata: Record<string, unknown>;
} {
  const processes = [
    'proxy',
    ...new Set([...t.spans, ...t.instants].map((s) => s.process).filter((p) => p !== 'proxy')),
  ];
  const pid = (p: string): number => processes.indexOf(p) + 1;
  const tid = (lane: string): number => (lane === 'proxy' ? 1 : LANES.indexOf(lane as LaneKind) + 1);
  const ev: Array<Record<string, unknown>> = nameEvents(processes, pid, tid);
  for (const s of t.spans) {
    ev.push({
      ph: 'X',
      name: s.name,
      cat: s.lane,
      pid: pid(s.process),
      tid: tid(s.lane),
      ts: s.startMs * US,
      dur: Math.max(s.durMs * US, 0.001),
      args: { key: s.key, ...s.args, ...(s.race ? { race: s.race } : {}) },
      ...(s.race ? { cname: 'terrible' } : {}),
    });
  }
  for (const i of t.instants)
    ev.push({
      ph: 'i',
      s: 't',
      name: i.name,
      cat: i.lane,
      pid: pid(i.process),
      tid: tid(i.lane),
      ts: i.atMs * US,
      args: i.args,
    });
  for (const r of t.requests) {
    const common = { cat: 'request', name: `request ${r.index}`, id: r.index, pid: pid('proxy'), tid: 1 };
    ev.push({ ...common, ph: 'b', ts: r.startMs * US, args: { outcome: r.outcome } });
    ev.push({ ...common, ph: 'e', ts: Math.max(r.endMs, r.startMs) * US });
  }
  pushRaceFlows(ev, t, pid, tid);
  return { traceEvents: ev, displayTimeUnit: 'ms', metadata: { title: t.title, races: t.races.map((r) => r.text) } };
}
