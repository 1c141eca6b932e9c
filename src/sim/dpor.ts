/**
 * Dynamic partial-order reduction (source-DPOR, Abdulla et al. POPL'14, with sleep sets) over a
 * stateless system: every schedule is a fresh execution from the initial state, driven through
 * `DporChooser`. The search keeps one node per choice point of the current execution,
 *
 *   node i: enabled keys (+ footprints) | chosen key | backtrack set | done set | sleep set
 *
 * replays a prefix by choosing the same keys (asserting the replay sees the same enabled keys), and
 * after each execution adds backtrack points for every reversible race it saw:
 *
 *   events i < j race  <=>  dependent(i, j), j was not created by i, and no event k with i ->hb k ->hb j
 *   then at node i, unless backtrack(i) already holds one, add an initial of notdep(i).j
 *   (an event of the sequence "what ran after i not hb-after i, then j" with no hb-predecessor in it).
 *
 * A step that disables an enabled key (a cancelled NIC item) is treated as racing with it: the key is
 * added to that node's backtrack set. Keys are unique one-shot events (the world's `D.op#12`, `net#7`);
 * a key newly enabled at node k is "created" by the event just before it (hb edge).
 *
 * Dependence: footprints of objects read and written (`D/host`, `D/page:3`, `P/grant:t-1`; `D/*` is
 * every object of D), and `global` (dependent with everything: scenario actions, steps during which a
 * timer fired, time jumps). Sleep sets use conditional independence at the node: besides disjoint
 * footprints, the two steps together must end before the next timer (cost(p)+cost(q) < horizon), so
 * neither order fires a timer inside them. Bounds: only the first `depth` branching nodes get backtrack
 * points (later ones take the first key not asleep), and at most `maxSchedules` executions.
 */
import { assert } from '../util/assert.ts';

export interface Footprint {
  reads: readonly string[];
  writes: readonly string[];
  /** Dependent with every other step. */
  global: boolean;
  /** Virtual time the step takes (sleep-set propagation checks it against the timer horizon). */
  costMs: number;
}

export interface Candidate {
  key: string;
  fp: Footprint;
}

/** What a system sees of the search during one execution. */
export interface DporChooser {
  /** A choice point: index into `enabled` (non-empty, deterministic order); `horizonMs`: time to the next timer. */
  choose(enabled: readonly Candidate[], horizonMs: number): number;
  /** The step just chosen ran; `global` if it did something unforeseen (fired a timer); extra objects written. */
  ran(global: boolean, extraWrites?: readonly string[]): void;
  /** Something that is not a choice happened (time jumped, timers fired): ordered with everything. */
  barrier(): void;
  /** The execution ended with these keys still enabled (the last step may have disabled others). */
  end(enabled: readonly string[]): void;
}

export interface DporSystem<R> {
  execute(chooser: DporChooser): Promise<R>;
}

export interface DporBounds {
  /** Branching choice points explored per execution (later ones take the first key not asleep). */
  depth: number;
  maxSchedules: number;
}

export interface DporStats {
  schedules: number;
  /** Every schedule within the bounds was explored and no bound cut a backtrack point. */
  exhausted: boolean;
  /** A backtrack point was wanted beyond the depth bound. */
  depthCut: boolean;
  /** Stopped at maxSchedules (or by the caller) with backtrack points left. */
  capped: boolean;
  /** Executions whose every enabled key was asleep at some node (redundant, still run to the end). */
  sleepBlocked: number;
  /** Races that found no initial enabled at their node (all enabled keys were added instead). */
  fallbacks: number;
}

/** `mark` is 'r' or 'w'; `X/*` covers every object of X. */
function overlaps(a: readonly string[], b: readonly string[]): boolean {
  for (const x of a) {
    for (const y of b) {
      if (x === y) return true;
      if (x.endsWith('/*') && y.startsWith(x.slice(0, -1))) return true;
      if (y.endsWith('/*') && x.startsWith(y.slice(0, -1))) return true;
    }
  }
  return false;
}

export function dependent(a: Footprint, b: Footprint): boolean {
  if (a.global || b.global) return true;
  return overlaps(a.writes, b.writes) || overlaps(a.writes, b.reads) || overlaps(a.reads, b.writes);
}

function withExtra(fp: Footprint, global: boolean, extra: readonly string[]): Footprint {
  if (!global && extra.length === 0) return fp;
  return { ...fp, global: fp.global || global, writes: [...fp.writes, ...extra] };
}

interface Node {
  enabled: Map<string, Footprint>;
  order: string[];
  horizonMs: number;
  /** Branching nodes before this one (the depth bound counts these). */
  branchIndex: number;
  chosen: string;
  backtrack: Set<string>;
  /** Keys explored from here, with the footprint they ran with. */
  done: Map<string, Footprint>;
  /** Asleep on entry, with the footprint they ran with where they were explored. */
  sleep: Map<string, Footprint>;
  blocked: boolean;
}

interface Event {
  node: number | null;
  key: string;
  fp: Footprint;
  /** The event that made `key` enabled (-1: enabled from the start). */
  creator: number;
}

export class DporSearch<R> {
  private stack: Node[] = [];
  readonly stats: DporStats = {
    schedules: 0,
    exhausted: false,
    depthCut: false,
    capped: false,
    sleepBlocked: 0,
    fallbacks: 0,
  };
  /** The schedule of the last execution: the chosen index at every branching node, trailing zeros dropped. */
  lastSchedule: number[] = [];

  constructor(
    private readonly system: DporSystem<R>,
    private readonly bounds: DporBounds,
  ) {
    assert(bounds.depth >= 0 && bounds.maxSchedules >= 1, 'dpor bounds: depth >= 0, maxSchedules >= 1');
  }

  /** Explore; `onSchedule` sees each execution's result and may stop the search by returning true. */
  async run(onSchedule: (r: R, schedule: readonly number[]) => boolean | void): Promise<DporStats> {
    for (;;) {
      const events: Event[] = [];
      const result = await this.system.execute(this.chooser(events));
      this.stats.schedules++;
      this.detectRaces(events);
      if (onSchedule(result, this.lastSchedule) === true) break;
      if (!this.nextBranch()) {
        this.stats.exhausted = !this.stats.depthCut;
        return this.stats;
      }
      if (this.stats.schedules >= this.bounds.maxSchedules) break;
    }
    this.stats.capped = true;
    return this.stats;
  }

  private chooser(events: Event[]): DporChooser {
    let depth = 0;
    let branches = 0;
    const schedule: number[] = [];
    let pendingNode: Node | null = null;
    const createdBy = new Map<string, number>();
    let prevEnabled = new Set<string>();
    return {
      choose: (enabled, horizonMs) => {
        assert(pendingNode === null, 'dpor: choose twice without ran()');
        assert(enabled.length > 0, 'dpor: a choice point with nothing enabled');
        const keys = enabled.map((c) => c.key);
        for (const k of keys) if (!createdBy.has(k)) createdBy.set(k, events.length - 1);
        this.noteDisabled(prevEnabled, keys, depth - 1);
        prevEnabled = new Set(keys);
        const node = this.nodeAt(depth, enabled, horizonMs, branches);
        if (enabled.length > 1) {
          branches++;
          schedule.push(node.order.indexOf(node.chosen));
        }
        depth++;
        pendingNode = node;
        const idx = node.order.indexOf(node.chosen);
        assert(idx >= 0, `dpor: chosen ${node.chosen} not enabled`);
        return idx;
      },
      ran: (global, extraWrites = []) => {
        const node = pendingNode;
        assert(node !== null, 'dpor: ran() without choose()');
        pendingNode = null;
        const fp = withExtra(node.enabled.get(node.chosen) as Footprint, global, extraWrites);
        node.done.set(node.chosen, fp);
        events.push({ node: depth - 1, key: node.chosen, fp, creator: createdBy.get(node.chosen) ?? -1 });
        let end = schedule.length;
        while (end > 0 && schedule[end - 1] === 0) end--;
        this.lastSchedule = schedule.slice(0, end);
      },
      barrier: () => {
        assert(pendingNode === null, 'dpor: barrier inside a step');
        events.push({ node: null, key: '', fp: { reads: [], writes: [], global: true, costMs: 0 }, creator: -1 });
      },
      end: (enabled) => this.noteDisabled(prevEnabled, enabled, depth - 1),
    };
  }

  /** The node at `depth`: replayed (same enabled keys, same choice) or new (its sleep set from the parent). */
  private nodeAt(depth: number, enabled: readonly Candidate[], horizonMs: number, branchIndex: number): Node {
    const order = enabled.map((c) => c.key);
    const existing = this.stack[depth];
    if (existing !== undefined) {
      assert(
        existing.order.join(' ') === order.join(' '),
        () => `dpor replay diverged at choice ${depth}: [${existing.order.join(' ')}] then, [${order.join(' ')}] now`,
      );
      return existing;
    }
    const parent = this.stack[depth - 1];
    const sleep = new Map<string, Footprint>();
    if (parent !== undefined) {
      const p = parent.done.get(parent.chosen) as Footprint;
      const candidates = [...parent.sleep, ...parent.done].filter(([k]) => k !== parent.chosen);
      for (const [k, fp] of candidates) {
        const fits = p.costMs + fp.costMs < parent.horizonMs;
        if (order.includes(k) && fits && !dependent(p, fp)) sleep.set(k, fp);
      }
    }
    const awake = order.find((k) => !sleep.has(k));
    const node: Node = {
      enabled: new Map(enabled.map((c) => [c.key, c.fp])),
      order,
      horizonMs,
      branchIndex,
      chosen: awake ?? (order[0] as string),
      backtrack: new Set(),
      done: new Map(),
      sleep,
      blocked: awake === undefined,
    };
    node.backtrack.add(node.chosen);
    if (node.blocked) this.stats.sleepBlocked++;
    this.stack.push(node);
    return node;
  }

  /** A key enabled before node `at` ran and gone after it (cancelled): explore it before that step too. */
  private noteDisabled(before: Set<string>, now: readonly string[], at: number): void {
    const node = this.stack[at];
    if (node === undefined) return;
    const still = new Set(now);
    for (const k of before) if (k !== node.chosen && !still.has(k)) this.addBacktrack(node, k);
  }

  private addBacktrack(node: Node, key: string): void {
    if (node.backtrack.has(key) || node.sleep.has(key)) return;
    if (node.branchIndex >= this.bounds.depth) {
      this.stats.depthCut = true;
      return;
    }
    node.backtrack.add(key);
  }

  /** Source-DPOR race detection over one finished execution. */
  private detectRaces(events: Event[]): void {
    const n = events.length;
    // hb[j]: events i < j with i ->hb j (dependence or creation, transitively).
    const hb: Array<Set<number>> = [];
    for (let j = 0; j < n; j++) {
      const ej = events[j] as Event;
      const preds = new Set<number>();
      for (let i = j - 1; i >= 0; i--) {
        if (preds.has(i)) continue;
        if (ej.creator === i || dependent((events[i] as Event).fp, ej.fp)) {
          preds.add(i);
          for (const k of hb[i] as Set<number>) preds.add(k);
        }
      }
      hb.push(preds);
    }
    for (let j = 0; j < n; j++) {
      const ej = events[j] as Event;
      if (ej.node === null) continue;
      for (const i of hb[j] as Set<number>) {
        const ei = events[i] as Event;
        if (ei.node === null || ej.creator === i || !dependent(ei.fp, ej.fp)) continue;
        // Direct race: no k with i ->hb k ->hb j.
        let direct = true;
        for (const k of hb[j] as Set<number>) if (k > i && (hb[k] as Set<number>).has(i)) direct = false;
        if (direct) this.reverse(events, hb, i, j);
      }
    }
  }

  private reverse(events: Event[], hb: Array<Set<number>>, i: number, j: number): void {
    const node = this.stack[(events[i] as Event).node as number] as Node;
    // v = notdep(i).j; its initials: members with no hb-predecessor inside v.
    const v: number[] = [];
    for (let k = i + 1; k < j; k++) if (!(hb[k] as Set<number>).has(i)) v.push(k);
    v.push(j);
    const initials = v
      .filter((k) => !v.some((m) => m < k && (hb[k] as Set<number>).has(m)))
      .map((k) => (events[k] as Event).key)
      .filter((key) => key !== '' && node.enabled.has(key));
    if (initials.some((k) => node.backtrack.has(k) || node.sleep.has(k))) return;
    if (initials.length > 0) return this.addBacktrack(node, initials[0] as string);
    this.stats.fallbacks++;
    for (const k of node.order) this.addBacktrack(node, k);
  }

  /** Pop to the deepest node with an unexplored backtrack key and make it the next choice there. */
  private nextBranch(): boolean {
    while (this.stack.length > 0) {
      const node = this.stack[this.stack.length - 1] as Node;
      const next = node.order.find((k) => node.backtrack.has(k) && !node.done.has(k) && !node.sleep.has(k));
      if (next !== undefined) {
        node.chosen = next;
        return true;
      }
      this.stack.pop();
    }
    return false;
  }
}
