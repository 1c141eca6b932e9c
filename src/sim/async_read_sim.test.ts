/**
 * The simulator on async READ loads (scenarios 1p1d-async, abort-async): every oracle holds over random
 * and PCT schedules; the seed's race is still caught without the fix (zero-none, at seed 1) and so is a
 * release sent before the READ landed (read-done-early).
 *
 * abort-async's first run found a leak: a request aborted after its READ was reported landed, in a step
 * whose output the scheduler had not applied yet, stayed `recv-aborted` on the scheduler side for ever
 * (the worker no longer knew the READ, so it never reported the pages freeable): the decode never went
 * idle ("virtual time budget exhausted; busy instances [D]", 1p1d-async random seed 38 among others).
 * The last test failed that way before the fix (ReadConsumer.aborted: releaseNow).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runSim } from './run_sim.ts';

for (const scenario of ['1p1d-async', 'abort-async'] as const) {
  for (const strategy of ['random', 'pct'] as const) {
    test(`${scenario} / ${strategy}: 40 seeds, no violation`, async () => {
      const r = await runSim({ scenario, strategy, seeds: 40 });
      assert.deepEqual(
        r.violations.map((v) => `${v.seed}: ${v.oracle}: ${v.message.slice(0, 200)}`),
        [],
      );
      assert.ok((r.coverage.seen['L<F'] ?? 0) > 0, 'READs landed before the forwards that read them');
    });
  }
}

for (const [mutant, expect] of [
  ['zero-none', 'lifecycle:I1'],
  ['read-done-early', 'lifecycle:I5'],
] as const) {
  test(`1p1d-async: ${mutant} is caught at seed 1 (${expect})`, async () => {
    const r = await runSim({ scenario: '1p1d-async', strategy: 'random', seeds: 1, mutant, stopAtFirstFailure: true });
    assert.equal(r.firstFailingSeed, 1);
    const found = r.violations.map((v) => (v.invariant ? `${v.oracle}:${v.invariant}` : v.oracle));
    assert.ok(found.includes(expect), `expected ${expect}, got ${found.join(', ')}`);
  });
}

test('1p1d-async random seed 38: an abort after the READ was reported landed frees the pages (no stuck decode)', async () => {
  const r = await runSim({ scenario: '1p1d-async', strategy: 'random', seed: 38, seeds: 1 });
  assert.deepEqual(
    r.violations.map((v) => v.message.slice(0, 200)),
    [],
  );
});
