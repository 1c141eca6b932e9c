/**
 * A brute-force oracle for the race checker (test support): it builds the happens-before graph of a
 * program explicitly (one node per host action, stream item, NIC request, event) and finds races by
 * graph reachability, with no vector clocks and no pruning. The checker must report, for every
 * access, a race exactly when the oracle finds one with some earlier access, and every pair it
 * names must be a real race. (Which earlier partner is named may differ: the checker keeps only
 * undominated accesses.)
 */
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { RaceChecker } from './race_checker.ts';
import type { PageAccess } from '../types.ts';

const STREAMS = ['s0', 's1'];
const PAGE = 8;

export type Command =
  | { k: 'enqueue'; stream: number; acc: PageAccess[] }
  | { k: 'record'; stream: number }
  | { k: 'streamWait'; stream: number; ev: number }
  | { k: 'hostWaitOp'; op: number }
  | { k: 'hostWaitEvent'; ev: number }
  | { k: 'nicPost'; acc: PageAccess[] }
  | { k: 'nicObserved'; wr: number }
  | { k: 'nicEvent'; wr: number }
  | { k: 'host'; acc: PageAccess[] };

const accessArb: fc.Arbitrary<PageAccess> = fc
  .record({ slab: fc.nat(1), block: fc.nat(1), a: fc.nat(PAGE), b: fc.nat(PAGE), write: fc.boolean() })
  .filter(({ a, b }) => a !== b)
  .map(({ slab, block, a, b, write }) => ({ slab, block, start: Math.min(a, b), end: Math.max(a, b), write }));
const accs = fc.array(accessArb, { minLength: 1, maxLength: 3 });
const idx = fc.nat(1000);

export const commandArb: fc.Arbitrary<Command> = fc.oneof(
  fc.record({ k: fc.constant('enqueue' as const), stream: fc.nat(1), acc: accs }),
  fc.record({ k: fc.constant('record' as const), stream: fc.nat(1) }),
  fc.record({ k: fc.constant('streamWait' as const), stream: fc.nat(1), ev: idx }),
  fc.record({ k: fc.constant('hostWaitOp' as const), op: idx }),
  fc.record({ k: fc.constant('hostWaitEvent' as const), ev: idx }),
  fc.record({ k: fc.constant('nicPost' as const), acc: accs }),
  fc.record({ k: fc.constant('nicObserved' as const), wr: idx }),
  fc.record({ k: fc.constant('nicEvent' as const), wr: idx }),
  fc.record({ k: fc.constant('host' as const), acc: accs }),
);

interface Accessor {
  node: number;
  key: string;
  acc: PageAccess[];
}

class Graph {
  readonly succ: number[][] = [];
  private hostLast = -1;
  node(): number {
    this.succ.push([]);
    return this.succ.length - 1;
  }
  edge(a: number, b: number): void {
    this.succ[a]!.push(b);
  }
  hostNode(): number {
    const n = this.node();
    if (this.hostLast >= 0) this.edge(this.hostLast, n);
    this.hostLast = n;
    return n;
  }
  reaches(from: number, to: number): boolean {
    const seen = new Set<number>([from]);
    const stack = [from];
    while (stack.length > 0) {
      const n = stack.pop()!;
      if (n === to) return true;
      for (const m of this.succ[n]!) if (!seen.has(m)) (seen.add(m), stack.push(m));
    }
    return false;
  }
}

function conflict(x: PageAccess, y: PageAccess): boolean {
  return (
    x.slab === y.slab &&
    x.block === y.block &&
    Math.max(x.start, y.start) < Math.min(x.end, y.end) &&
    (x.write || y.write)
  );
}

/** Run `cmds` through a RaceChecker and the oracle; assert they agree. */
export function runAgainstOracle(cmds: Command[]): void {
  const r = new Replay();
  for (const cmd of cmds) r.apply(cmd);
  const got = checkedReports(r);
  assert.deepEqual([...got].sort(), [...expectedRaces(r)].sort());
}

/** The same program fed to the checker and recorded as the oracle's graph, command by command. */
class Replay {
  readonly c = new RaceChecker();
  readonly g = new Graph();
  readonly accessors: Accessor[] = [];
  private readonly streamLast = STREAMS.map(() => -1);
  private readonly ops: Array<{ id: number; node: number }> = [];
  private readonly wrs: Array<{ id: number; node: number }> = [];
  private readonly events: Array<{ id: number; node: number }> = [];
  private hostAccesses = 0;

  constructor() {
    STREAMS.forEach((s) => this.c.addStream(s));
  }

  /** A command that names an op, event or work request when there is none yet is skipped. */
  apply(cmd: Command): void {
    const { c, g, ops, wrs, events, accessors } = this;
    if (cmd.k === 'enqueue') {
      const o = g.node();
      g.edge(g.hostNode(), o);
      this.onStream(cmd.stream, o);
      const id = c.hostEnqueue(STREAMS[cmd.stream]!, { what: 'op' }, cmd.acc);
      ops.push({ id, node: o });
      accessors.push({ node: o, key: `op${id}`, acc: cmd.acc });
    } else if (cmd.k === 'record') {
      const e = g.node();
      g.edge(g.hostNode(), e);
      if (this.streamLast[cmd.stream]! >= 0) g.edge(this.streamLast[cmd.stream]!, e);
      events.push({ id: c.recordEvent(STREAMS[cmd.stream]!), node: e });
    } else if (cmd.k === 'streamWait' && events.length > 0) {
      const ev = events[cmd.ev % events.length]!;
      const wNode = g.node();
      g.edge(g.hostNode(), wNode);
      g.edge(ev.node, wNode);
      this.onStream(cmd.stream, wNode);
      c.streamWaitEvent(STREAMS[cmd.stream]!, ev.id);
    } else if (cmd.k === 'hostWaitOp' && ops.length > 0) {
      const op = ops[cmd.op % ops.length]!;
      g.edge(op.node, g.hostNode());
      c.hostWaitOp(op.id);
    } else if (cmd.k === 'hostWaitEvent' && events.length > 0) {
      const ev = events[cmd.ev % events.length]!;
      g.edge(ev.node, g.hostNode());
      c.hostWaitEvent(ev.id);
    } else if (cmd.k === 'nicPost') {
      const n = g.node();
      g.edge(g.hostNode(), n);
      const id = c.nicPost({ what: 'wr' }, cmd.acc);
      wrs.push({ id, node: n });
      accessors.push({ node: n, key: `nic${id}`, acc: cmd.acc });
    } else if (cmd.k === 'nicObserved' && wrs.length > 0) {
      const wr = wrs[cmd.wr % wrs.length]!;
      g.edge(wr.node, g.hostNode());
      c.nicObserved(wr.id);
    } else if (cmd.k === 'nicEvent' && wrs.length > 0) {
      const wr = wrs[cmd.wr % wrs.length]!;
      const e = g.node();
      g.edge(wr.node, e);
      events.push({ id: c.nicCompletionEvent(wr.id), node: e });
    } else if (cmd.k === 'host') {
      const h = g.hostNode();
      c.hostReadPages({ what: 'host' }, cmd.acc);
      accessors.push({ node: h, key: `host${++this.hostAccesses}`, acc: cmd.acc });
    }
  }

  private onStream(s: number, n: number): void {
    if (this.streamLast[s]! >= 0) this.g.edge(this.streamLast[s]!, n);
    this.streamLast[s] = n;
  }
}

/** The oracle's answer: `later|slab|block` for every access unordered after a conflicting earlier one. */
function expectedRaces({ g, accessors }: Replay): Set<string> {
  const expected = new Set<string>();
  accessors.forEach((later, j) => {
    for (let i = 0; i < j; i++) {
      const earlier = accessors[i]!;
      if (g.reaches(earlier.node, later.node)) continue;
      for (const x of earlier.acc)
        for (const y of later.acc) if (conflict(x, y)) expected.add(`${later.key}|${y.slab}|${y.block}`);
    }
  });
  return expected;
}

/** The checker's reports as `later|slab|block`, each checked to name a real, correctly ordered race. */
function checkedReports({ c, g, accessors }: Replay): Set<string> {
  const byKey = new Map(accessors.map((a, i) => [a.key, { ...a, order: i }]));
  const got = new Set<string>();
  for (const rep of c.races()) {
    const a = byKey.get(`${rep.a.source}${rep.a.id}`);
    const b = byKey.get(`${rep.b.source}${rep.b.id}`);
    assert.ok(a !== undefined && b !== undefined, 'report names unknown accesses');
    assert.ok(a.order < b.order, 'a report names the earlier access first');
    assert.ok(!g.reaches(a.node, b.node), `reported pair ${a.key} -> ${b.key} is ordered`);
    got.add(`${b.key}|${rep.slab}|${rep.block}`);
  }
  return got;
}
