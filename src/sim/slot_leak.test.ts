/**
 * A failed or aborted work request that never gives its NIC
 * completion-queue slot back. The leak oracle counted pages only, so the planted slot-leak-on-fail escaped
 * `sim --scenario all --strategy random,pct --seeds 40`: in a world of a few requests the lost slots never
 * add up to the 1,024 after which every transfer fails OVERLOADED. The oracle now also wants every slot free
 * at the end: 1p1d catches the mutant by seed 2, random and PCT, and the correct build passes those seeds.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runSim } from './run_sim.ts';

test('slot-leak-on-fail: caught on 1p1d within 2 seeds (random, pct) as a leak; the correct build passes them', async () => {
  for (const strategy of ['random', 'pct'] as const) {
    const planted = await runSim({ scenario: '1p1d', strategy, seeds: 2, mutant: 'slot-leak-on-fail' });
    assert.notEqual(planted.firstFailingSeed, null, `${strategy}: the planted bug escaped`);
    assert.ok(planted.violations.some((v) => v.oracle === 'leak' && /completion-queue slots/.test(v.message)));
    const correct = await runSim({ scenario: '1p1d', strategy, seeds: 2 });
    assert.equal(correct.firstFailingSeed, null, correct.violations[0]?.message);
  }
});
