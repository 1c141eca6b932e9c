/**
 * Seeds across threads: `--jobs N` changes the wall time only. The report of a run (violations, first
 * failing seed, schedule hashes) is the same for 1 and 2 threads, because results are consumed in seed
 * order; `--budget-s` stops starting seeds once the time is spent.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import { isHandoffError } from '../util/errors.ts';
import { runSim, type SimReport } from './run_sim.ts';
import { runSweep } from './sweep.ts';

const sizeless = (r: SimReport): Partial<SimReport> => {
  const { schedulesPerSec: _a, wallSeconds: _b, jobs: _c, ...rest } = r;
  return rest;
};

test('jobs: 1 and 2 seed threads give the same report, violations and first failing seed included', async () => {
  const o = { scenario: '1p1d', strategy: 'random', seeds: 6, seed: 3, mutant: 'tail-not-zeroed' } as const;
  const one = await runSim({ ...o, jobs: 1 });
  const two = await runSim({ ...o, jobs: 2 });
  assert.equal(two.jobs, 2);
  assert.ok(one.violations.length > 0, 'the mutant is caught in these seeds (else the comparison proves little)');
  assert.deepEqual(sizeless(two), sizeless(one));
});

test('jobs: stop at the first failure is the same seed whatever the threads', async () => {
  const o = {
    scenario: '1p1d',
    strategy: 'pct',
    seeds: 8,
    mutant: 'zero-mamba-only',
    stopAtFirstFailure: true,
  } as const;
  const one = await runSim({ ...o, jobs: 1 });
  const two = await runSim({ ...o, jobs: 2 });
  assert.equal(one.firstFailingSeed, 1);
  assert.deepEqual(sizeless(two), sizeless(one));
});

test('budget: once the budget is spent no further seed starts (a frozen clock with budget 0: one seed)', async () => {
  const r = await runSim({ scenario: '1p1d', strategy: 'random', seeds: 50, budgetS: 0 }, new SimEnv(0));
  assert.equal(r.schedules, 1);
  assert.equal(r.distinctSchedules, 1);
});

test('sweep: every (scenario, strategy) pair on one pool, with totals; a planted bug fails its runs', async () => {
  const o = { scenarios: ['1p1d', 'abort'], strategies: ['random', 'pct'], seeds: 2, jobs: 2 } as const;
  const ok = await runSweep(o);
  assert.deepEqual(
    ok.runs.map((r) => `${r.scenario}/${r.strategy}`),
    ['1p1d/random', '1p1d/pct', 'abort/random', 'abort/pct'],
  );
  assert.equal(ok.schedules, 8);
  assert.equal(ok.failingRuns, 0);
  const bad = await runSweep({ ...o, scenarios: ['1p1d'], mutant: 'zero-mamba-only' });
  assert.equal(bad.failingRuns, 2);
});

test('a scenario the model cannot play is a BAD_CONFIG before any seed runs; a sweep skips it with the reason', async () => {
  await assert.rejects(
    runSim({ scenario: '1p1d-write', strategy: 'random', seeds: 2, jobs: 2, model: 'hybrid-micro' }),
    (e: unknown) => isHandoffError(e) && e.code === 'BAD_CONFIG' && /READ only/.test(e.message),
  );
  const s = await runSweep({
    scenarios: ['1p1d', '1p1d-write'],
    strategies: ['random'],
    seeds: 1,
    model: 'hybrid-micro',
  });
  assert.deepEqual(
    s.runs.map((r) => r.scenario),
    ['1p1d'],
  );
  assert.equal(s.skipped[0]?.scenario, '1p1d-write');
});
