/**
 * Session 14: with prefill's pages larger than decode's, decode's local prefix hit can end
 * inside a prefill page (a 40-token hit: 5 decode pages of 8, 1.25 prefill pages of 32). No scenario made
 * that happen: every shared prefix was 32 tokens, a multiple of every page size, so the hit was always
 * aligned on both sides. Planting `Math.ceil(start / remote.blockSize)` for `Math.floor` in
 * connector/alignment.ts tokenRun (the remote run starts a page late) passed the whole sweep (`sim
 * --scenario all --strategy random,pct --seeds 40`: no violation) while it crashes decode's engine loop
 * ("remote: pages 1..2 of 32 tokens do not cover [56, 88)") on such a request. The `hetero-hit`
 * scenario (prefill pages the larger, a 40/48/56-token prefix shared by every request) catches it (14/13
 * of seeds 1-40, first seed 2), and the bug zoo's `hit-start-rounded-up` (the same mistake in the READ
 * mapping: wrong KV) at seed 4. Before, `hetero-hit` did not exist and this file failed.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runSim } from './run_sim.ts';
import { buildScenario } from './scenarios.ts';

test('hetero-hit: decode prefix hits end inside a prefill page', () => {
  let unaligned = 0;
  for (let seed = 1; seed <= 8; seed++) {
    const sc = buildScenario('hetero-hit', 'dsv4-micro', seed);
    assert.ok(sc.prefill.blockSize > sc.decode.blockSize, `seed ${seed}: prefill's pages are the larger`);
    const [a, b] = sc.requests.map((r) => r.promptTokenIds);
    let shared = 0;
    while (a?.[shared] !== undefined && a[shared] === b?.[shared]) shared++;
    const hit = Math.floor(shared / sc.decode.blockSize) * sc.decode.blockSize;
    if (hit % sc.prefill.blockSize !== 0) unaligned++;
  }
  assert.ok(unaligned > 0, 'no seed gives decode a hit that ends inside a prefill page');
});

for (const strategy of ['random', 'pct'] as const)
  test(`hit-start-rounded-up is caught by hetero-hit (${strategy}) within 4 seeds`, async () => {
    const r = await runSim({
      scenario: 'hetero-hit',
      strategy,
      seeds: 4,
      mutant: 'hit-start-rounded-up',
      stopAtFirstFailure: true,
    });
    assert.notEqual(r.firstFailingSeed, null, 'hit-start-rounded-up escaped hetero-hit');
    assert.ok(r.violations.some((v) => v.oracle === 'pd-equals-colocated'));
  });

test('hetero-hit: the correct build equals colocated with unaligned hits (READ and WRITE seeds)', async () => {
  const r = await runSim({ scenario: 'hetero-hit', strategy: 'random', seeds: 10 });
  assert.deepEqual(
    r.violations.map((v) => v.message),
    [],
  );
});
