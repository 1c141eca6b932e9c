/**
 * Tensor parallelism in the simulated world (`--prefill-tp 2 --decode-tp 2`): each instance's device
 * has two rank streams, each rank its own slabs, zeroing split per rank (the explorer runs the parts
 * apart), READs and WRITEs copying every rank's slabs to the same rank. Proves the P/D worlds pass
 * every oracle at TP=2 (P/D == colocated against the TP=1 reference: the degree changes no bit) for the
 * three model families, and the seed's bug is still caught (unequal degrees: hetero_tp.test.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isHandoffError } from '../util/errors.ts';
import { runSim } from './run_sim.ts';
import { buildScenario } from './scenarios.ts';
import { SimWorld } from './world.ts';

const TP2 = { prefillTp: 2, decodeTp: 2 } as const;

for (const model of ['dsv4-micro', 'hybrid-micro', 'llama-micro'] as const) {
  test(`${model} TP=2: 1p1d passes every oracle under random and pct; READ worlds move every rank's pages`, async () => {
    for (const strategy of ['random', 'pct'] as const) {
      const r = await runSim({ scenario: '1p1d', strategy, seeds: 4, model, ...TP2 });
      assert.equal(r.firstFailingSeed, null, `${strategy}: ${r.violations[0]?.message ?? ''}`);
    }
  });
}

test('TP=2: WRITE, prefix hits and preemption pass; zero-mamba-only and other mutants are caught at seed 1; the replay names the degrees', async () => {
  for (const scenario of ['1p1d-write', 'prefix-hit', 'preempt'] as const) {
    const r = await runSim({ scenario, strategy: 'random', seeds: 3, ...TP2 });
    assert.equal(r.firstFailingSeed, null, `${scenario}: ${r.violations[0]?.message ?? ''}`);
  }
  const bug = await runSim({ scenario: '1p1d', strategy: 'random', seeds: 2, mutant: 'zero-mamba-only', ...TP2 });
  assert.equal(bug.firstFailingSeed, 1);
  assert.match(bug.replay ?? '', /--prefill-tp 2 --decode-tp 2/);
  for (const mutant of ['no-await-reads', 'tail-not-zeroed', 'read-done-early'] as const) {
    const r = await runSim({ scenario: '1p1d', strategy: 'random', seeds: 2, mutant, ...TP2 });
    assert.equal(r.firstFailingSeed, 1, `${mutant} is caught at TP=2`);
  }
});

test('TP=2 world: both instances have two rank streams and twice the slabs; zero parts are separate choices', async () => {
  const w = await SimWorld.create({
    scenario: '1p1d',
    preset: 'dsv4-micro',
    seed: 1,
    strategy: 'random',
    trace: true,
    ...TP2,
  });
  for (const inst of w.instances) {
    assert.equal(inst.kvConfig.tensorParallelSize, 2);
    assert.equal(inst.device.ranks, 2);
    assert.equal(inst.device.slabs.length, 2 * inst.kvConfig.numLayerSlabs);
  }
  await w.run();
  const keys = (w.trace?.spans ?? []).map((s) => s.key);
  await w.shutdown();
  assert.ok(
    keys.some((k) => /^D\.op#\d+\.r0$/.test(k)) && keys.some((k) => /^D\.op#\d+\.r1$/.test(k)),
    'rank parts of decode zero ops ran as their own choices',
  );
  assert.ok(
    keys.some((k) => /^D\.op#\d+$/.test(k)),
    'forwards ran as one gang choice',
  );
  assert.equal(buildScenario('1p1d', 'dsv4-micro', 1, { prefillTp: 2, decodeTp: 1 }).decode.tensorParallelSize, 1);
  assert.throws(
    () => buildScenario('1p1d', 'llama-micro', 1, { prefillTp: 3, decodeTp: 3 }),
    (e: unknown) => isHandoffError(e) && e.code === 'BAD_CONFIG' && /--prefill-tp must divide/.test(e.message),
  );
});
