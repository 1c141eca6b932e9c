/**
 * The correct build in the simulated world: every scenario passes every oracle (race checker, page
 * lifecycle, P/D == colocated, liveness, leaks) for the tested seeds under random and PCT exploration
 * with faults on, and exhaustively (bounded DFS) on a one-request world; runs are pure functions of
 * their seed (a replay gives the same schedule and the same violation); the report keeps the JSON
 * contract of DESIGN.md §10. Bugs the simulator found in the build (and that are fixed) are kept as regression tests.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SCENARIOS } from './scenarios.ts';
import { formatSimReport, runSeed, runSim } from './run_sim.ts';

const describeFailure = (r: Awaited<ReturnType<typeof runSim>>): string => formatSimReport(r).slice(0, 1500);

for (const scenario of SCENARIOS) {
  test(`correct build, ${scenario}: seeds 1-2 random and seed 1 PCT pass every oracle`, async () => {
    for (const [strategy, seeds] of [
      ['random', 2],
      ['pct', 1],
    ] as const) {
      const r = await runSim({ scenario, strategy, seeds });
      assert.equal(r.firstFailingSeed, null, describeFailure(r));
      assert.equal(r.seeds, seeds);
    }
  });
}

test('correct build, other presets: hybrid-mini (Mamba) and llama-mini (no zeroing) pass 1p1d and preempt', async () => {
  for (const model of ['hybrid-mini', 'llama-mini'] as const) {
    for (const scenario of ['1p1d', 'preempt'] as const) {
      const r = await runSim({ scenario, strategy: 'random', seeds: 1, model });
      assert.equal(r.firstFailingSeed, null, describeFailure(r));
    }
  }
});

test('correct build, bounded DFS: every schedule of a one-request 1p1d-write world passes', async () => {
  const r = await runSim({ scenario: '1p1d-write', strategy: 'dfs', seeds: 200, requests: 1, dfsDepth: 10 });
  assert.equal(r.firstFailingSeed, null, describeFailure(r));
  assert.ok(r.seeds >= 10 && r.seeds < 200, `the bounded space was enumerated and exhausted (${r.seeds} schedules)`);
});

test('replay: the same seed gives the same schedule and the same first violation; another seed another schedule', async () => {
  const o = { scenario: '1p1d', strategy: 'random', mutant: 'zero-none' } as const;
  const a = await runSeed(o, 4, false);
  const b = await runSeed(o, 4, false);
  assert.ok(a.violations.length > 0);
  assert.equal(a.choiceHash, b.choiceHash);
  assert.deepEqual(a.violations[0], b.violations[0]);
  const clean1 = await runSeed({ scenario: 'abort', strategy: 'pct' }, 3, false);
  const clean2 = await runSeed({ scenario: 'abort', strategy: 'pct' }, 3, false);
  assert.equal(clean1.choiceHash, clean2.choiceHash);
  assert.equal(clean1.steps, clean2.steps);
  assert.notEqual((await runSeed({ scenario: 'abort', strategy: 'pct' }, 5, false)).choiceHash, clean1.choiceHash);
});

test('report: the keys of the JSON contract and the run size; --replay runs the one seed of the command', async () => {
  const r = await runSim({ scenario: '1p1d', strategy: 'random', seeds: 2, mutant: 'no-await-reads', seed: 7 });
  assert.deepEqual(Object.keys(r).sort(), [
    'coverage',
    'distinctSchedules',
    'firstFailingSeed',
    'jobs',
    'mutant',
    'replay',
    'scenario',
    'schedules',
    'schedulesPerSec',
    'seeds',
    'strategy',
    'violations',
    'wallSeconds',
  ]);
  assert.equal(r.firstFailingSeed, 7);
  assert.equal(r.replay, 'handoff sim --scenario 1p1d --strategy random --seed 7 --mutant no-await-reads --replay');
  assert.ok(r.schedulesPerSec > 0);
  assert.doesNotThrow(() => JSON.stringify(r));
  const again = await runSim({
    scenario: '1p1d',
    strategy: 'random',
    seeds: 99,
    seed: 7,
    mutant: 'no-await-reads',
    replay: true,
  });
  assert.equal(again.seeds, 1);
  assert.deepEqual(again.violations[0], r.violations[0]);
  assert.match(formatSimReport(r), /FAIL: .*first at seed 7[\s\S]*replay: handoff sim/);
});

test('regression: decode never READs into its own prefix-hit pages (found by the simulator)', async () => {
  const r = await runSim({ scenario: 'prefix-hit', strategy: 'random', seeds: 2 });
  assert.equal(r.firstFailingSeed, null, describeFailure(r));
});

test('regression: with async scheduling, pages whose synchronous READ later fails are never published for prefix hits (seeds 5 and 23, found by the simulator)', async () => {
  for (const seed of [5, 23]) {
    const r = await runSim({ scenario: 'prefix-hit', strategy: 'random', seeds: 1, seed });
    assert.equal(r.firstFailingSeed, null, describeFailure(r));
  }
});

test('regression: WRITE mode, a decode request aborted while the producer WRITE is in flight keeps its pages until no WRITE can land (found by the simulator)', async () => {
  const r = await runSim({ scenario: '1p1d-write', strategy: 'random', seeds: 1, seed: 22 });
  assert.equal(r.firstFailingSeed, null, describeFailure(r));
});
