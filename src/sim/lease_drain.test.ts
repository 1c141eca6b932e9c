/**
 * A lease that ends while decode's READ is still under way must not free prefill's pages before the NIC
 * drained the grant. The default sweep never caught the planted bug (a READ rarely outlives the 300 ms
 * lease); the late-answer fault (prefill's answer and decode's READ come late, at the lease's end) makes
 * 1p1d catch mutant lease-no-drain by seed 6 (I4: freed while granted), random and PCT, while the correct
 * build passes the same seeds with the fault firing.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runSeed, runSim } from './run_sim.ts';

test('lease-no-drain: caught on 1p1d within 6 seeds (random, pct); the correct build passes them', async () => {
  for (const strategy of ['random', 'pct'] as const) {
    const planted = await runSim({ scenario: '1p1d', strategy, seeds: 6, mutant: 'lease-no-drain' });
    assert.notEqual(planted.firstFailingSeed, null, `${strategy}: the planted bug escaped`);
    assert.ok(planted.violations.some((v) => v.invariant === 'I4'));
    const correct = await runSim({ scenario: '1p1d', strategy, seeds: 6 });
    assert.equal(correct.firstFailingSeed, null);
  }
  let fired = 0;
  for (let seed = 1; seed <= 6; seed++)
    fired += (await runSeed({ scenario: '1p1d', strategy: 'random' }, seed, false)).faultsFired['late-answer'] ?? 0;
  assert.ok(fired > 0, 'the late-answer fault fires in seeds 1-6');
});
