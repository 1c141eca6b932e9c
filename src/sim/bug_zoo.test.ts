/**
 * The bug zoo in CI: every mutant of src/util/mutants.ts is caught by the simulator within the seed
 * bound of bug_zoo.ts, by the oracle that names its bug, with random and PCT exploration and with
 * bounded DFS on a one-request world; the report carries a replay command that reproduces it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MUTANTS, mutationsFor, type MutantName } from '../util/mutants.ts';
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

test('stale-writer: the epoch oracle (I7) is the first report, at the free, before any I4 or corrupted output', async () => {
  const r = await runSim({ scenario: 'abort-write', strategy: 'random', seeds: 2, mutant: 'stale-writer' });
  const first = r.violations.filter((v) => v.seed === r.firstFailingSeed);
  assert.ok(first.length > 0, 'caught');
  assert.equal(first[0]!.invariant, 'I7', first[0]!.message);
  assert.match(first[0]!.message, /freed while the peer may still write it/);
});

test('read-done-early: the release reaches the producer before the READ landed (I5), as well as the early forward', async () => {
  const r = await runSim({ scenario: '1p1d', strategy: 'random', seeds: 1, mutant: 'read-done-early' });
  assert.ok(r.violations.some((v) => v.invariant === 'I5' && /release for xfer-\d+ sent while READ/.test(v.message)));
});

test('prefix-shift moves remote pages only when decode has a cached prefix; the correct mapping keeps token t <- token t', () => {
  const remote = [1, 2, 3, 4];
  const ok = mutationsFor(undefined).readSources;
  const bad = mutationsFor('prefix-shift').readSources;
  assert.deepEqual(ok(remote, 32, 16), remote);
  // Two local pages cached: remote page 0 now sits where token 32 is read (local page 2), and so on.
  assert.deepEqual(bad(remote, 32, 16), [1, 2, 1, 2, 3, 4]);
  assert.deepEqual(bad(remote, 0, 16), ok(remote, 0, 16));
});
