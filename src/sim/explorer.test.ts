/**
 * The explorer strategies and the fault switch: every decision is a pure function of the seed, PCT
 * runs the highest-priority agent until a change point, bounded DFS enumerates every schedule of a
 * small choice tree exactly once and flags seeds past it, and BUGGIFY never fires when off.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { Buggify, FAULT_SITES } from './buggify.ts';
import { createExplorer, type ChoiceInfo, type Strategy } from './explorer.ts';

const choices = (agents: string[]): ChoiceInfo[] => agents.map((agent, i) => ({ key: `${agent}#${i}`, agent }));

function trace(strategy: Strategy, seed: number, rounds: number): number[] {
  const e = createExplorer(strategy, seed, { pctDepth: 3, pctSteps: 10 });
  return Array.from({ length: rounds }, (_, i) => e.pick(choices(['a', 'b', 'c', 'd'].slice(0, 1 + (i % 4)))));
}

test('random and pct: the same seed gives the same picks, every pick is in range, and seeds differ', () => {
  fc.assert(
    fc.property(fc.constantFrom<Strategy>('random', 'pct'), fc.integer({ min: 0, max: 1e6 }), (s, seed) => {
      const a = trace(s, seed, 40);
      assert.deepEqual(a, trace(s, seed, 40));
      a.forEach((p, i) => assert.ok(p >= 0 && p < 1 + (i % 4)));
    }),
    { numRuns: 50 },
  );
  const distinct = new Set(Array.from({ length: 20 }, (_, s) => trace('random', s, 40).join(''))).size;
  assert.ok(distinct > 15, `random seeds give different schedules (${distinct} of 20)`);
});

test('pct: without change points one agent runs while it is enabled; a change point hands over to another', () => {
  const e = createExplorer('pct', 7, { pctDepth: 1 });
  const cs = choices(['x', 'y', 'z']);
  const first = e.pick(cs);
  for (let i = 0; i < 20; i++) assert.equal(e.pick(cs), first, 'depth 1: the top agent keeps running');
  let handedOver = 0;
  for (let seed = 0; seed < 30; seed++) {
    const d = createExplorer('pct', seed, { pctDepth: 2, pctSteps: 5 });
    const picks = Array.from({ length: 10 }, () => d.pick(cs));
    if (new Set(picks).size > 1) handedOver++;
  }
  assert.ok(handedOver > 20, `depth 2 with 5 steps changes the running agent in most seeds (${handedOver}/30)`);
});

test('dfs: seeds 0..n-1 enumerate every schedule of a 2x3x2 tree exactly once; seed n is a duplicate', () => {
  const run = (seed: number) => {
    const e = createExplorer('dfs', seed, { dfsDepth: 8 });
    const path = [
      e.pick(choices(['a', 'b'])),
      e.pick(choices(['only'])),
      e.pick(choices(['a', 'b', 'c'])),
      e.pick(choices(['a', 'b'])),
    ];
    return { path: path.join(''), duplicate: e.duplicate };
  };
  const paths = Array.from({ length: 12 }, (_, s) => run(s));
  assert.equal(new Set(paths.map((p) => p.path)).size, 12);
  assert.ok(paths.every((p) => !p.duplicate));
  assert.equal(run(12).duplicate, true);
  assert.equal(run(12).path, run(0).path);
});

test('dfs: choices past the depth bound take the first option', () => {
  const e = createExplorer('dfs', 5, { dfsDepth: 1 });
  assert.equal(e.pick(choices(['a', 'b', 'c', 'd', 'e', 'f'])), 5);
  assert.equal(e.pick(choices(['a', 'b', 'c'])), 0);
});

test('buggify: off never fires; on, a site is enabled per run from the seed and fires reproducibly', () => {
  const off = new Buggify(1, false);
  assert.ok(FAULT_SITES.every((s) => !off.fire(s, 1)));
  const draws = (seed: number) => {
    const b = new Buggify(seed, true);
    return FAULT_SITES.map((s) => [b.isOn(s), b.fire(s, 1)])
      .flat()
      .join();
  };
  assert.equal(draws(3), draws(3));
  const enabledCounts = Array.from({ length: 200 }, (_, s) => new Buggify(s, true).enabledSites.length);
  const mean = enabledCounts.reduce((a, b) => a + b, 0) / enabledCounts.length;
  assert.ok(mean > 1 && mean < 3, `about a quarter of ${FAULT_SITES.length} sites are on per run (mean ${mean})`);
});

test('dpor replay: the schedule gives the index at each branching choice, then the first; a bad index is BAD_CONFIG', () => {
  const e = createExplorer('dpor', 0, { schedule: [2, 1] });
  assert.equal(e.pick(choices(['only'])), 0, 'a single choice does not use a digit');
  assert.equal(e.pick(choices(['a', 'b', 'c'])), 2);
  assert.equal(e.pick(choices(['a', 'b'])), 1);
  assert.equal(e.pick(choices(['a', 'b', 'c'])), 0, 'past the schedule: the first choice');
  const bad = createExplorer('dpor', 0, { schedule: [5] });
  assert.throws(() => bad.pick(choices(['a', 'b'])), /BAD_CONFIG|not this world/);
});
