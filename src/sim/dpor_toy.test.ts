/**
 * The reduction itself, on toy transition systems independent of the LLM world: processes run fixed
 * steps that read and write shared variables. Proves that DPOR explores exactly one schedule per
 * Mazurkiewicz trace (n independent processes: 1; two writers of one variable: 2; random programs:
 * as many as naive enumeration finds distinct traces, and every one of them), that bounds stop it,
 * and that a step which disables another (a cancel) is explored both ways.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { DporSearch, dependent, type Candidate, type DporChooser, type Footprint } from './dpor.ts';

interface Step {
  reads: string[];
  writes: string[];
}
type Program = Step[][];

const fpOf = (s: Step): Footprint => ({ reads: s.reads, writes: s.writes, global: false, costMs: 0 });

/** One execution: returns the executed keys in order. */
function execute(prog: Program, pick: (enabled: Candidate[]) => number, ran: () => void): string[] {
  const pc = prog.map(() => 0);
  const out: string[] = [];
  for (;;) {
    const enabled: Candidate[] = [];
    prog.forEach((steps, p) => {
      const s = steps[pc[p] as number];
      if (s !== undefined) enabled.push({ key: `p${p}.${pc[p]}`, fp: fpOf(s) });
    });
    if (enabled.length === 0) return out;
    const c = enabled[pick(enabled)] as Candidate;
    out.push(c.key);
    const p = Number(c.key.slice(1, c.key.indexOf('.')));
    pc[p] = (pc[p] as number) + 1;
    ran();
  }
}

/** The trace (Mazurkiewicz class) of a schedule: the order of every dependent pair. */
function traceOf(prog: Program, keys: string[]): string {
  const fp = (k: string): Footprint => {
    const [p, i] = k.slice(1).split('.').map(Number);
    return fpOf((prog[p as number] as Step[])[i as number] as Step);
  };
  const pairs: string[] = [];
  for (let i = 0; i < keys.length; i++)
    for (let j = i + 1; j < keys.length; j++)
      if (dependent(fp(keys[i] as string), fp(keys[j] as string))) pairs.push(`${keys[i]}<${keys[j]}`);
  return pairs.sort().join(' ');
}

/** Every interleaving, by a plain recursive DFS over choice indices: the set of traces it covers. */
function naiveTraces(prog: Program): Set<string> {
  const out = new Set<string>();
  const all = (prefix: number[]): void => {
    let width = 0;
    let depth = 0;
    const keys = execute(
      prog,
      (en) => {
        if (depth === prefix.length) width = en.length;
        return prefix[depth++] ?? 0;
      },
      () => {},
    );
    if (depth === prefix.length) {
      out.add(traceOf(prog, keys));
      return;
    }
    for (let c = 0; c < width; c++) all([...prefix, c]);
  };
  all([]);
  return out;
}

async function dpor(prog: Program, depth = 100, maxSchedules = 100_000) {
  const search = new DporSearch<string[]>(
    {
      execute: async (ch: DporChooser) =>
        execute(
          prog,
          (en) => ch.choose(en, Infinity),
          () => ch.ran(false),
        ),
    },
    { depth, maxSchedules },
  );
  const traces: string[] = [];
  const stats = await search.run((keys) => void traces.push(traceOf(prog, keys)));
  return { stats, traces };
}

const indep = (n: number, k: number): Program =>
  Array.from({ length: n }, (_, p) => Array.from({ length: k }, () => ({ reads: [], writes: [`x${p}`] })));

test('n independent processes of k steps: exactly one schedule, and the space is exhausted', async () => {
  for (const [n, k] of [
    [2, 2],
    [3, 3],
    [4, 2],
  ] as const) {
    const { stats } = await dpor(indep(n, k));
    assert.equal(stats.schedules, 1, `${n}x${k}`);
    assert.equal(stats.exhausted, true);
  }
});

test('two processes writing the same variable: exactly 2 traces; two readers of it: 1', async () => {
  const w = (v: string): Step => ({ reads: [], writes: [v] });
  const r = (v: string): Step => ({ reads: [v], writes: [] });
  const writers = await dpor([
    [w('a'), w('x')],
    [w('b'), w('x')],
  ]);
  assert.equal(writers.stats.schedules, 2);
  assert.equal(new Set(writers.traces).size, 2);
  const readers = await dpor([
    [r('x'), w('a')],
    [r('x'), w('b')],
  ]);
  assert.equal(readers.stats.schedules, 1);
  // Three processes each writing x once: 3! orders of the writes.
  assert.equal((await dpor([[w('x')], [w('x')], [w('x')]])).stats.schedules, 6);
});

test('random programs: one schedule per Mazurkiewicz trace, every trace of naive enumeration found', async () => {
  const step = fc.record({
    reads: fc.subarray(['x', 'y', 'z'], { maxLength: 2 }),
    writes: fc.subarray(['x', 'y', 'z'], { maxLength: 1 }),
  });
  const program = fc.array(fc.array(step, { minLength: 1, maxLength: 3 }), { minLength: 2, maxLength: 3 });
  await fc.assert(
    fc.asyncProperty(program, async (prog) => {
      const naive = naiveTraces(prog);
      const { stats, traces } = await dpor(prog);
      assert.equal(stats.exhausted, true);
      assert.deepEqual(new Set(traces), naive, 'the same set of traces');
      assert.equal(stats.schedules - stats.sleepBlocked, naive.size, 'no trace twice');
    }),
    { numRuns: 60, seed: 7 },
  );
});

test('bounds: maxSchedules caps the search; a depth of 0 explores one schedule and says it cut', async () => {
  const w = (v: string): Step => ({ reads: [], writes: [v] });
  const prog = [[w('x')], [w('x')], [w('x')]];
  const capped = await dpor(prog, 100, 4);
  assert.equal(capped.stats.schedules, 4);
  assert.equal(capped.stats.capped, true);
  assert.equal(capped.stats.exhausted, false);
  const shallow = await dpor(prog, 0);
  assert.equal(shallow.stats.schedules, 1);
  assert.equal(shallow.stats.depthCut, true);
  assert.equal(shallow.stats.exhausted, false);
});

test('a step seen cancelling another is explored in both orders (disabling counts as a race)', async () => {
  // 'cancel' runs first and removes 'job' from the enabled set without touching a common object: the
  // search must still try 'job' before it. (A cancel it never sees happen must be declared as a dependence
  // in the footprints: in the world, whoever can abort a work request writes its poster's host.)
  const runs = new Set<string>();
  const search = new DporSearch<string>(
    {
      execute: async (ch) => {
        let cancelled = false;
        let jobDone = false;
        const order: string[] = [];
        for (;;) {
          const en: Candidate[] = [];
          if (!order.includes('cancel')) en.push({ key: 'cancel', fp: fpOf({ reads: [], writes: ['b'] }) });
          if (!cancelled && !jobDone) en.push({ key: 'job', fp: fpOf({ reads: [], writes: ['a'] }) });
          if (en.length === 0) {
            ch.end([]);
            return order.join(',');
          }
          const c = en[ch.choose(en, Infinity)] as Candidate;
          order.push(c.key);
          if (c.key === 'cancel') cancelled = true;
          else jobDone = true;
          ch.ran(false);
        }
      },
    },
    { depth: 10, maxSchedules: 10 },
  );
  await search.run((r) => void runs.add(r));
  assert.deepEqual([...runs].sort(), ['cancel', 'job,cancel']);
});
