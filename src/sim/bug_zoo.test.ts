/**
 * The bug zoo in CI: every mutant of src/util/mutants.ts is caught by the simulator within the seed
 * bound of bug_zoo.ts, by the oracle that names its bug, with random and PCT exploration and with
 * bounded DFS on a one-request world; the report carries a replay command that reproduces it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MUTANTS, type MutantName } from '../util/mutants.ts';
import { BUG_ZOO } from './bug_zoo.ts';
import { runSim } from './run_sim.ts';

const names = Object.keys(MUTANTS) as MutantName[];

test('every mutant has a zoo entry', () => {
  assert.deepEqual(Object.keys(BUG_ZOO).sort(), [...names].sort());
});

for (const mutant of names) {
  for (const strategy of ['random', 'pct'] as const) {
    const z = BUG_ZOO[mutant];
    test(`${mutant}: caught by ${strategy} on ${z.scenario} within ${z.seedsBound[strategy]} seed(s), as ${z.expect}`, async () => {
      const r = await runSim({
        scenario: z.scenario,
        strategy,
        seeds: z.seedsBound[strategy],
        mutant,
        stopAtFirstFailure: true,
      });
      assert.notEqual(r.firstFailingSeed, null, `${mutant} escaped ${r.seeds} seeds`);
      const found = r.violations
        .filter((v) => v.seed === r.firstFailingSeed)
        .map((v) => (v.invariant ? `${v.oracle}:${v.invariant}` : v.oracle));
      assert.ok(
        z.expect.split('|').some((e) => found.includes(e)),
        `expected ${z.expect}, got ${found.join(', ')}`,
      );
      assert.match(
        r.replay ?? '',
        new RegExp(
          `^handoff sim --scenario ${z.scenario} --strategy ${strategy} --seed ${r.firstFailingSeed} --mutant ${mutant} --replay$`,
        ),
      );
    });
  }
}

test('bounded DFS on a one-request world finds the abort race exhaustively (free-on-abort)', async () => {
  const r = await runSim({
    scenario: 'abort',
    strategy: 'dfs',
    seeds: 40,
    requests: 1,
    mutant: 'free-on-abort',
    stopAtFirstFailure: true,
  });
  assert.notEqual(r.firstFailingSeed, null);
  assert.ok(r.violations.some((v) => v.invariant === 'I4'));
  assert.match(r.replay ?? '', /--strategy dfs --seed \d+ --mutant free-on-abort --requests 1 --replay$/);
});
