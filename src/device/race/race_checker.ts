/**
 * Happens-before race checker (DESIGN.md §7), modelled on PyTorch's CUDA Stream Sanitizer with the
 * NIC as one more agent.
 *
 *   host ──enqueue──> stream op ──FIFO──> next op on the stream
 *     │  ──record──> event ──wait──> (later ops of a stream | the host)
 *     │  <──observe (await ticket)── op
 *     └──post──> NIC work request ──observed (poll/wait)──> host
 *
 * Every op, NIC work request and host access is recorded, in host program order, with a vector clock
 * computed from those edges only: never from the timing of the run. So a zeroing that happened to
 * run before a NIC write in this run still races with it if nothing orders the two.
 *
 * Components: 0 is the host, one per stream, and the NIC split into lanes. NIC work requests are not
 * FIFO (they complete and are observed in any order), so one NIC component would order them
 * falsely; instead each in-flight request takes a lane, and a lane is reused only once the host has
 * observed its last request, which keeps every lane's epochs totally ordered. Reports name the agent
 * 'nic' whatever the lane.
 */
import { assert } from '../../util/assert.ts';
import { ClockTable } from './clock_table.ts';
import type { RaceReport } from './race_report.ts';
import { ShadowMemory, type AccessOwner, type NewAccess, type RaceSink, type ShadowEntry } from './shadow_memory.ts';
import type { OpLabel, PageAccess, RaceCheckerLike } from '../types.ts';
import { VectorClock } from './vector_clock.ts';

export interface RaceCheckerOptions {
  /** Reports kept; later distinct races are counted in stats().droppedReports. */
  racesMax?: number;
  /** Op, event and work-request clocks kept while the host has not observed them. */
  inFlightMax?: number;
  /**
   * NIC work requests in flight and unobserved at once; as many as the work-request clock table keeps
   * (inFlightMax): a step's READs may be cut into thousands (the simulator's split-transfer fault at one
   * token per prefill page: 4,000-5,000 for six requests at TP 2), and a lower bound failed correct runs.
   */
  nicLanesMax?: number;
}

export interface RaceCheckerStats {
  shadowEntries: number;
  opClocks: number;
  eventClocks: number;
  nicClocks: number;
  nicLanes: number;
  droppedReports: number;
}

const HOST = 0;

interface Lane {
  component: number;
  /** Tick of the lane's latest work request. */
  epoch: number;
}

export class RaceChecker implements RaceCheckerLike {
  private readonly agents: string[] = ['host'];
  private readonly host = new VectorClock();
  private readonly streams = new Map<string, { component: number; clock: VectorClock }>();
  private readonly lanes: Lane[] = [];
  private readonly ops: ClockTable;
  private readonly events: ClockTable;
  private readonly wrs: ClockTable;
  private readonly shadow = new ShadowMemory();
  private readonly boundEvents = new WeakMap<object, number>();
  private reports: RaceReport[] = [];
  private reportIndex = new Map<string, RaceReport>();
  private droppedReports = 0;
  private hostAccessId = 0;
  private readonly racesMax: number;
  private readonly nicLanesMax: number;

  constructor(opts: RaceCheckerOptions = {}) {
    const inFlightMax = opts.inFlightMax ?? 65_536;
    this.racesMax = opts.racesMax ?? 10_000;
    this.nicLanesMax = opts.nicLanesMax ?? inFlightMax;
    assert(this.racesMax > 0 && this.nicLanesMax > 0, 'race checker bounds must be positive');
    this.ops = new ClockTable('op', inFlightMax);
    this.events = new ClockTable('event', inFlightMax);
    this.wrs = new ClockTable('NIC work request', inFlightMax);
  }

  /** Register a stream (an agent with FIFO ops). Idempotent. */
  addStream(name: string): void {
    assert(name !== 'host' && name !== 'nic', `stream name '${name}' is reserved`);
    if (this.streams.has(name)) return;
    this.streams.set(name, { component: this.agents.length, clock: new VectorClock() });
    this.agents.push(name);
  }

  /** The host enqueues an op on `stream`; returns the op id for hostWaitOp. */
  hostEnqueue(stream: string, label: OpLabel, footprint: readonly PageAccess[]): number {
    const s = this.stream(stream);
    this.host.tick(HOST);
    s.clock.join(this.host);
    const tick = s.clock.tick(s.component);
    const clock = s.clock.copy();
    const id = this.ops.add(clock, this.host);
    this.recordAll(footprint, clock, s.component, tick, { agent: stream, source: 'op', id, label });
    return id;
  }

  /** The host observed op `opId` complete (its ticket resolved or rejected into host code). */
  hostWaitOp(opId: number): void {
    const clock = this.ops.get(opId);
    if (clock === null) return;
    this.host.join(clock);
    this.ops.delete(opId);
  }

  /** An event recorded on `stream`: reached once everything enqueued on it so far has executed. */
  recordEvent(stream: string): number {
    const s = this.stream(stream);
    this.host.tick(HOST);
    const clock = s.clock.copy();
    clock.join(this.host);
    return this.events.add(clock, this.host);
  }

  /** An event recorded on several streams at once (every rank of a RankedStream): reached when all are. */
  recordEventOn(streams: readonly string[]): number {
    assert(streams.length > 0, 'an event needs at least one stream');
    this.host.tick(HOST);
    const clock = this.host.copy();
    for (const name of streams) clock.join(this.stream(name).clock);
    return this.events.add(clock, this.host);
  }

  /** Later ops of `stream` wait for the event. */
  streamWaitEvent(stream: string, eventId: number): void {
    const s = this.stream(stream);
    this.host.tick(HOST);
    const clock = this.events.get(eventId);
    if (clock !== null) s.clock.join(clock);
  }

  /** The host waited for the event (wait() resolved into host code, or query() returned true). */
  hostWaitEvent(eventId: number): void {
    const clock = this.events.get(eventId);
    if (clock !== null) this.host.join(clock);
  }

  nicPost(label: OpLabel, footprint: PageAccess[]): number {
    this.host.tick(HOST);
    const lane = this.freeLane();
    lane.epoch += 1;
    const clock = this.host.copy();
    clock.set(lane.component, lane.epoch);
    const id = this.wrs.add(clock, this.host);
    this.recordAll(footprint, clock, lane.component, lane.epoch, { agent: 'nic', source: 'nic', id, label });
    return id;
  }

  nicObserved(wrId: number): void {
    const clock = this.wrs.get(wrId);
    if (clock !== null) this.host.join(clock);
    this.wrs.delete(wrId);
  }

  /** An event reached when work request `wrId` completes, so a stream can wait on the NIC. */
  nicCompletionEvent(wrId: number): number {
    const clock = this.wrs.get(wrId);
    return this.events.add(clock === null ? new VectorClock() : clock.copy(), this.host);
  }

  /** Associate a DeviceEvent object with a checker event id (devices and NICs do this). */
  bindEvent(ev: object, eventId: number): void {
    this.boundEvents.set(ev, eventId);
  }

  eventIdOf(ev: object): number | undefined {
    return this.boundEvents.get(ev);
  }

  /** The host itself touches pages (e.g. reads a received page, or a test writes one). */
  hostReadPages(label: OpLabel, accesses: readonly PageAccess[]): void {
    const tick = this.host.tick(HOST);
    const id = ++this.hostAccessId;
    this.recordAll(accesses, this.host.copy(), HOST, tick, { agent: 'host', source: 'host', id, label });
  }

  races(): RaceReport[] {
    return this.reports.map((r) => ({ ...r, range: { ...r.range } }));
  }

  /** Forget the reports found so far (the clocks and shadow memory stay, so later races are still found). */
  clear(): void {
    this.reports = [];
    this.reportIndex = new Map();
    this.droppedReports = 0;
  }

  stats(): RaceCheckerStats {
    return {
      shadowEntries: this.shadow.entryCount(),
      opClocks: this.ops.size,
      eventClocks: this.events.size,
      nicClocks: this.wrs.size,
      nicLanes: this.lanes.length,
      droppedReports: this.droppedReports,
    };
  }

  private stream(name: string): { component: number; clock: VectorClock } {
    const s = this.streams.get(name);
    assert(s !== undefined, `race checker: unknown stream '${name}' (addStream first)`);
    return s;
  }

  private freeLane(): Lane {
    // Invariant: a lane is reused only when the host has seen its latest request, so anything that
    // knows the new request also knows every earlier one on the lane.
    for (const lane of this.lanes) {
      if (this.host.get(lane.component) >= lane.epoch) return lane;
    }
    assert(this.lanes.length < this.nicLanesMax, `race checker: more than ${this.nicLanesMax} NIC requests unobserved`);
    const lane = { component: this.agents.length, epoch: 0 };
    this.agents.push('nic');
    this.lanes.push(lane);
    return lane;
  }

  private recordAll(
    accesses: readonly PageAccess[],
    clock: VectorClock,
    component: number,
    tick: number,
    owner: AccessOwner,
  ): void {
    for (const acc of accesses) {
      if (!(Number.isInteger(acc.start) && Number.isInteger(acc.end) && acc.start >= 0 && acc.start < acc.end))
        assert(false, `bad access range [${acc.start},${acc.end}) in '${owner.label.what}'`);
      this.shadow.record(acc, component, tick, owner, clock, this.onRace);
    }
  }

  private readonly onRace: RaceSink = (a, b, overlap) => this.report(a, b, b.slab, b.block, overlap);

  private report(
    a: ShadowEntry,
    b: NewAccess,
    slab: number,
    block: number,
    overlap: { start: number; end: number },
  ): void {
    const key = `${a.owner.source}${a.owner.id}|${b.owner.source}${b.owner.id}|${slab}|${block}`;
    const seen = this.reportIndex.get(key);
    if (seen !== undefined) {
      seen.range.start = Math.min(seen.range.start, overlap.start);
      seen.range.end = Math.max(seen.range.end, overlap.end);
      return;
    }
    if (this.reports.length >= this.racesMax) {
      this.droppedReports++;
      return;
    }
    const info = (x: ShadowEntry) => ({ ...x.owner, write: x.write, start: x.start, end: x.end });
    const r: RaceReport = { a: info(a), b: info(b), slab, block, range: { ...overlap } };
    this.reports.push(r);
    this.reportIndex.set(key, r);
  }
}
