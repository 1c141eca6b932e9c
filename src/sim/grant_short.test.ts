/**
 * Review (session 16): the liveness oracle's undisturbed-loads check (a KV load that failed and was
 * recomputed although nothing disturbed the run) skipped every run in which any fault fired, harmless ones
 * included (a zeroing delayed a few steps, a duplicated notification, decode pages taken): 36 of 1p1d's
 * seeds 1-40. A READ refused on every prompt whose N-1 tokens end on a page boundary (mutant
 * grant-one-page-short: prefill grants only the pages of the N-1 tokens, decode's whole-page READ also
 * reads the next) is recomputed, a 200 with the right tokens, so nothing else sees it: it escaped all 80
 * schedules of 1p1d (random and pct, seeds 1-40) and was caught in 10 of `sim --scenario all`'s 1280.
 *
 * Proves: runs where only harmless faults fired are judged too, so 1p1d catches the mutant within 35 seeds
 * (random and pct) as liveness, and the correct build passes those seeds.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runSim } from './run_sim.ts';

for (const strategy of ['random', 'pct'] as const)
  test(`grant-one-page-short: 1p1d ${strategy} catches the silently recomputed READ within 35 seeds`, async () => {
    const r = await runSim({
      scenario: '1p1d',
      strategy,
      seeds: 35,
      mutant: 'grant-one-page-short',
      stopAtFirstFailure: true,
    });
    assert.notEqual(r.firstFailingSeed, null, 'escaped 35 seeds');
    const first = r.violations.filter((v) => v.seed === r.firstFailingSeed);
    assert.ok(
      first.some((v) => v.oracle === 'liveness' && /KV load\(s\) failed/.test(v.message)),
      JSON.stringify(first),
    );
  });

test('the correct build passes 1p1d seeds 1-35 under the stricter undisturbed-loads check', async () => {
  for (const strategy of ['random', 'pct'] as const) {
    const r = await runSim({ scenario: '1p1d', strategy, seeds: 35 });
    assert.equal(r.firstFailingSeed, null, JSON.stringify(r.violations));
  }
});
