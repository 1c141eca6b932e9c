/**
 * DPOR over the simulated world (1p1d, one request, faults off): it finds every kind of violation
 * (oracle and invariant) that naive bounded DFS finds, for several mutants, with strictly fewer
 * schedules; it exhausts the correct build's space with no violation, re-executing prefixes with the
 * same keys (the search asserts it); its replay line reproduces the counterexample exactly; and the
 * coverage line tells the correct build's order (land, then forward) from the zeroing bug's; and, as
 * an empirical check of the dependence relation, every order in which each engine saw its steps under
 * exhaustive dfs is also reached by dpor.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { MutantName } from '../util/mutants.ts';
import { DporSearch } from './dpor.ts';
import { runDpor } from './dpor_run.ts';
import { DporWorldExplorer } from './dpor_world.ts';
import { createExplorer, type ChoiceInfo, type Explorer } from './explorer.ts';
import { SimWorld } from './world.ts';
import { runSeed, runSim, type SimOptions } from './run_sim.ts';

const kinds = (vs: ReadonlyArray<{ oracle: string; invariant?: string }>): string[] =>
  [...new Set(vs.map((v) => `${v.oracle}:${v.invariant ?? ''}`))].sort();

const base = (mutant?: MutantName): SimOptions => ({
  scenario: mutant === 'write-done-early' ? '1p1d-write' : '1p1d',
  strategy: 'dfs',
  seeds: 5000,
  requests: 1,
  faults: false,
  ...(mutant ? { mutant } : {}),
});

test('dpor finds every violation kind bounded dfs finds, for several mutants, in no more schedules', async () => {
  // free-on-abort is order-dependent (only some abort moments fail): explored to full depth.
  const cases: Array<[MutantName, SimOptions['scenario'], number]> = [
    ['zero-mamba-only', '1p1d', 3],
    ['no-await-reads', '1p1d', 3],
    ['free-before-release', '1p1d', 3],
    ['write-done-early', '1p1d-write', 3],
    ['free-on-abort', 'abort', 40],
  ];
  for (const [m, scenario, depth] of cases) {
    const dfs = await runSim({ ...base(m), scenario, dfsDepth: depth });
    const dpor = await runDpor({ ...base(m), scenario, strategy: 'dpor', dporDepth: depth });
    assert.ok(dfs.violations.length > 0, `${m}: dfs catches it`);
    for (const k of kinds(dfs.violations)) assert.ok(kinds(dpor.violations).includes(k), `${m}: dpor finds ${k}`);
    // Never more than dfs (a 2-schedule space may need both); fewer on spaces of any size (the next test).
    assert.ok(dpor.schedules <= dfs.seeds, `${m}: dpor ${dpor.schedules} <= dfs ${dfs.seeds} schedules`);
  }
});

test('correct build: dpor exhausts the depth-3 space with no violation in fewer schedules than dfs', async () => {
  const dfs = await runSim({ ...base(), dfsDepth: 3 });
  const dpor = await runDpor({ ...base(), strategy: 'dpor', dporDepth: 3 });
  assert.equal(dfs.violations.length, 0);
  assert.equal(dpor.violations.length, 0);
  assert.ok(dpor.schedules > 1, 'there is more than one trace to explore');
  assert.ok(dpor.schedules < dfs.seeds, `dpor ${dpor.schedules} < dfs ${dfs.seeds} schedules`);
  assert.equal(dpor.bound.capped, false);
});

test('correct build: dpor exhausts the whole 1-request world (no depth cut) with no violation', async () => {
  const r = await runDpor({ ...base(), strategy: 'dpor' });
  assert.equal(r.exhausted, true);
  assert.equal(r.bound.depthCut, false);
  assert.equal(r.violations.length, 0);
  assert.ok(r.schedules > 1);
  assert.ok(r.coverage.seen['L<F'] !== undefined, 'READ destinations: landed, then read by the forward');
});

test("a counterexample's replay line runs exactly the failing schedule (an order-dependent bug)", async () => {
  // free-on-abort fails only when the abort comes at the wrong moment: not the first schedule.
  const abort: SimOptions = { ...base('free-on-abort'), scenario: 'abort', strategy: 'dpor' };
  const r = await runDpor({ ...abort, stopAtFirstFailure: true });
  assert.ok(r.replay !== null && r.firstFailingSeed !== null && r.firstFailingSeed > 0, String(r.replay));
  const schedule = /--schedule (\S+)/.exec(r.replay)?.[1];
  assert.ok(schedule !== undefined, r.replay);
  const again = await runSeed({ ...abort, schedule: schedule.split('.').map(Number) }, 0, false);
  const first = r.violations[0];
  assert.ok(first !== undefined);
  assert.deepEqual(
    { oracle: again.violations[0]?.oracle, message: again.violations[0]?.message, step: again.violations[0]?.step },
    { oracle: first.oracle, message: first.message, step: first.step },
  );
});

test('coverage: the correct build lands then forwards; the zeroing bug shows zero and land in both orders', async () => {
  const ok = await runSeed({ ...base(), strategy: 'dfs' }, 0, true);
  assert.deepEqual(Object.keys(ok.coverage), ['L<F']);
  // Traced runs go on after the violation: dfs schedules 0 and 1 differ in zero-vs-READ at the race.
  const orders = new Set<string>();
  for (const seed of [0, 1, 2, 3]) {
    const r = await runSeed({ ...base('zero-mamba-only'), strategy: 'dfs', dfsDepth: 8 }, seed, true);
    for (const k of Object.keys(r.coverage)) orders.add(k);
  }
  assert.ok(orders.has('Z<L<F') && orders.has('L<Z<F'), `orders seen: ${[...orders].join(' ')}`);
});

/** What each instance's engine saw, in order: the steps whose completion ran its host code (names, not ids). */
async function projections(scenario: SimOptions['scenario'], mk: (w: SimWorld) => Explorer): Promise<string> {
  const log: Array<{ agent: string; what: string }> = [];
  const w = await SimWorld.create({
    scenario,
    preset: 'dsv4-micro',
    seed: 0,
    strategy: 'dfs',
    faults: false,
    requests: 1,
    makeExplorer: (world) => {
      const inner = mk(world);
      const pick = inner.pick.bind(inner);
      inner.pick = (cs) => {
        const i = pick(cs);
        const c = cs[i] as ChoiceInfo & { name?: string; args?: { requests?: unknown } };
        log.push({ agent: c.agent, what: `${c.name ?? ''} ${JSON.stringify(c.args?.requests ?? '')}` });
        return i;
      };
      return inner;
    },
  });
  await w.run();
  await w.shutdown();
  const sees = (x: string, agent: string): boolean =>
    agent === `${x}.compute` || agent === `${x}.nic` || agent.endsWith(`>${x}`);
  const per = ['P', 'D'].map((x) => log.filter((l) => sees(x, l.agent)).map((l) => l.what));
  return `${JSON.stringify(per)} @${w.env.nowMs().toFixed(6)}`;
}

test('soundness check: every per-instance order (and end time) that exhaustive dfs reaches, dpor reaches', async () => {
  for (const scenario of ['1p1d', 'abort'] as const) {
    const dfs = new Set<string>();
    for (let seed = 0, dups = 0; dups < 64; seed++) {
      let e: Explorer | null = null;
      const s = await projections(scenario, () => (e = createExplorer('dfs', seed, { dfsDepth: 40 })));
      if ((e as Explorer | null)?.duplicate === true) dups++;
      else (dfs.add(s), (dups = 0));
    }
    const dpor = new Set<string>();
    const search = new DporSearch(
      { execute: (ch) => projections(scenario, (w) => new DporWorldExplorer(w, ch)) },
      { depth: 40, maxSchedules: 10_000 },
    );
    await search.run((s) => void dpor.add(s));
    assert.ok(dfs.size > 1, `${scenario}: more than one order to find`);
    assert.deepEqual(
      [...dfs].filter((s) => !dpor.has(s)),
      [],
      `${scenario}: dfs orders dpor missed`,
    );
  }
});
