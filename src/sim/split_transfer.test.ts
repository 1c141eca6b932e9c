/**
 * A transfer split into several work requests. The simulator's
 * prompts are short, so a READ or WRITE never reached DESCRIPTORS_MAX ranges and always went as one work
 * request: planted bugs in the split (its last, partial work request never posted; a READ done once its
 * first work request landed) escaped `sim --scenario all --strategy random,pct --seeds 40`. The
 * split-transfer fault (buggify.ts: work requests of 1-3 ranges for a whole run, on a stream of its own)
 * makes 1p1d-write catch split-tail-dropped and 1p1d catch split-first-wr-only at seed 1, random and PCT,
 * while the correct build passes the same seeds with the fault on.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Buggify } from './buggify.ts';
import { runSim } from './run_sim.ts';

test('split-transfer: on at seed 1, it cuts both sides into work requests of 1-3 ranges', () => {
  const b = new Buggify(1, true);
  assert.ok(b.isOn('split-transfer'));
  const side = b.splitTransfers({ connector: { leaseMs: 1 } as { rangesPerWorkRequest?: number } });
  assert.ok([1, 2, 3].includes(side.connector.rangesPerWorkRequest ?? 0));
  const off = new Buggify(1, false);
  const same = { connector: { leaseMs: 1 } as { rangesPerWorkRequest?: number } };
  assert.equal(off.splitTransfers(same), same);
});

for (const [mutant, scenario, expect] of [
  ['split-tail-dropped', '1p1d-write', /^(I2|pd-equals-colocated)$/],
  ['split-first-wr-only', '1p1d', /^(I3|I5|race)$/],
] as const) {
  test(`${mutant}: caught on ${scenario} at seed 1 (random, pct); the correct build passes it`, async () => {
    for (const strategy of ['random', 'pct'] as const) {
      const planted = await runSim({ scenario, strategy, seeds: 1, mutant });
      assert.equal(planted.firstFailingSeed, 1, `${strategy}: the planted bug escaped`);
      assert.ok(planted.violations.some((v) => expect.test(v.invariant ?? v.oracle)));
      const correct = await runSim({ scenario, strategy, seeds: 1 });
      assert.equal(correct.firstFailingSeed, null, correct.violations[0]?.message);
    }
  });
}
