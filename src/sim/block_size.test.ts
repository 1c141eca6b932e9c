/**
 * Block size per deployment (`--block-size`, both instances alike): with 8 and 32 tokens per page the
 * P/D worlds still pass every oracle (P/D == colocated against a reference paged by 16: the output does
 * not depend on the page size), and the seed's bug is still caught. Different sizes on the two sides
 * are refused at the handshake (transfer/core/metadata.ts compatibilityProblem).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isHandoffError } from '../util/errors.ts';
import { runSim } from './run_sim.ts';
import { buildScenario } from './scenarios.ts';
import { SimWorld } from './world.ts';

for (const blockSize of [8, 32]) {
  test(`block size ${blockSize}: 1p1d, 1p1d-write and prefix-hit pass every oracle; zero-mamba-only is caught`, async () => {
    for (const scenario of ['1p1d', '1p1d-write', 'prefix-hit'] as const) {
      const r = await runSim({ scenario, strategy: 'random', seeds: 3, blockSize });
      assert.equal(r.firstFailingSeed, null, `${scenario}: ${r.violations[0]?.message ?? ''}`);
    }
    const bug = await runSim({ scenario: '1p1d', strategy: 'random', seeds: 2, blockSize, mutant: 'zero-mamba-only' });
    assert.equal(bug.firstFailingSeed, 1);
    assert.match(bug.replay ?? '', new RegExp(`--block-size ${blockSize}`), 'the replay line names the block size');
  });
}

test('block size: both engines page by it; pools keep their capacity in tokens; a non power of two is BAD_CONFIG', async () => {
  const w = await SimWorld.create({
    scenario: '1p1d',
    preset: 'dsv4-micro',
    seed: 1,
    strategy: 'random',
    blockSize: 8,
  });
  for (const inst of w.instances)
    assert.deepEqual(
      inst.kvConfig.groups.map((g) => g.spec.blockSize),
      [8, 8],
    );
  await w.shutdown();
  assert.equal(buildScenario('preempt', 'dsv4-micro', 1, { blockSize: 8 }).decode.numBlocks, 1 + 24);
  assert.equal(buildScenario('1p1d', 'dsv4-micro', 1).decode.numBlocks, 64);
  assert.throws(
    () => buildScenario('1p1d', 'dsv4-micro', 1, { blockSize: 12 }),
    (e: unknown) => isHandoffError(e) && e.code === 'BAD_CONFIG',
  );
});
