/**
 * Proves: DPOR's one-request worlds between block sizes and degrees have a clipped tail. The
 * hetero scenarios' first request is a multiple of 32 tokens (decode's lookahead tail); only the second
 * ends mid-page. So `sim --scenario hetero-tp --strategy dpor --requests 1` (the size DPOR exhausts; two
 * requests do not finish) never built a page the transfer fills only in part: it reported "space
 * exhausted, PASS" with `clip-tail-not-zeroed` on (the stale tail read by the forward), and with the tail
 * zeroing planted on rank 0's slabs only, at P TP1 / D TP2; and its coverage never showed a zeroing on a
 * landed page. A lone request is now of the second's kind. Before the fix: no violation in 144 schedules.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runDpor } from './dpor_run.ts';
import { buildScenario } from './scenarios.ts';
import type { SimOptions } from './run_sim.ts';

const world: SimOptions = {
  scenario: 'hetero-tp',
  strategy: 'dpor',
  seeds: 1,
  requests: 1,
  faults: false,
  prefillTp: 1,
  decodeTp: 2,
  prefillBlockSize: 8,
  decodeBlockSize: 32,
};

test('hetero worlds of one request end mid-page (a clipped tail when decode pages are the larger)', () => {
  for (const name of ['hetero-tp', 'hetero-block'] as const)
    for (let seed = 0; seed < 20; seed++) {
      const [r] = buildScenario(name, 'dsv4-micro', seed, { requests: 1 }).requests;
      assert.ok(r !== undefined && r.promptTokenIds.length % 32 !== 0, `${name} seed ${seed}`);
    }
});

test('dpor, one request, P TP1 / D TP2, pages 8 / 32: clip-tail-not-zeroed is caught; the correct build exhausts clean', async () => {
  const bug = await runDpor({ ...world, mutant: 'clip-tail-not-zeroed', stopAtFirstFailure: true });
  assert.ok(
    bug.violations.some((v) => v.invariant === 'I2'),
    `escaped: ${bug.schedules} schedules, ${JSON.stringify(bug.violations[0] ?? null)}`,
  );
  const ok = await runDpor(world);
  assert.equal(ok.exhausted, true);
  assert.deepEqual(ok.violations, []);
  assert.ok((ok.coverage.seen['L<Z<F'] ?? 0) > 0, `tails zeroed after their landing: ${JSON.stringify(ok.coverage)}`);
});
