/**
 * Proves: the order coverage counts a clipped tail's zeroing. Between block sizes (hetero-tp,
 * decode's pages the larger) the slots of a destination page past the transferred tokens are zeroed by a
 * `zero-spans` op after the READ or WRITE landed: the one zeroing of the correct build that touches a page
 * a transfer filled, so the one zero-vs-landing order the coverage line can show for it (`L<Z<F`).
 * coverage.ts counted only whole-page `zero` ops, so every run between degrees and sizes, DPOR's included,
 * reported the tail pages as `L<F` and "permutations never seen: all six", as if no zeroing had ever been
 * ordered against a landing. Before the fix this test saw no order with Z (e.g. {L<F: 10}).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runSeed } from './run_sim.ts';
import { buildScenario } from './scenarios.ts';

function seedWithMode(mode: 'read' | 'write'): number {
  for (let seed = 1; seed <= 40; seed++) if (buildScenario('hetero-tp', 'dsv4-micro', seed).mode === mode) return seed;
  return assert.fail(`no seed of 1-40 draws ${mode}`);
}

test('coverage: a clipped tail zeroed after its landing shows as L<Z<F, at P TP1 / D TP2 (READ and WRITE)', async () => {
  for (const mode of ['read', 'write'] as const) {
    const run = (sizes: [number, number]) =>
      runSeed(
        {
          scenario: 'hetero-tp',
          strategy: 'random',
          faults: false,
          prefillTp: 1,
          decodeTp: 2,
          prefillBlockSize: sizes[0],
          decodeBlockSize: sizes[1],
        },
        seedWithMode(mode),
        false,
      );
    const clipped = await run([8, 32]);
    assert.deepEqual(clipped.violations, [], mode);
    assert.ok(
      (clipped.coverage['L<Z<F'] ?? 0) > 0,
      `${mode}: tails zeroed after landing: ${JSON.stringify(clipped.coverage)}`,
    );
    // Decode's pages the smaller: no tail is clipped, no landed page is zeroed.
    const whole = await run([32, 8]);
    assert.deepEqual(whole.violations, [], mode);
    assert.deepEqual(
      Object.keys(whole.coverage).filter((k) => k.includes('Z') && k.includes('L')),
      [],
      `${mode}: ${JSON.stringify(whole.coverage)}`,
    );
  }
});
