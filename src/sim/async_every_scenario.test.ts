/**
 * `sim --async-read`: every READ scenario runs on async READ loads, serving's default since session 20 (the
 * `-async` scenarios covered only 1p1d and abort). Proves that the flag reaches decode's connector (its READs
 * are async, a WRITE scenario is unchanged), that the correct build passes scenarios whose flows differ
 * the most (cancels at every point, prefix hits, preemption, a dead peer), and that a seed's failure
 * replays with the flag named.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { OneSidedConnectorWorker } from '../connector/one_sided_worker.ts';
import { judgeEnd } from './oracles.ts';
import { runSim, replayCommand } from './run_sim.ts';
import { SimWorld } from './world.ts';

/** Decode's READs posted and, of them, async ones, over one world of `scenario`. */
async function decodeReads(scenario: '1p1d' | '1p1d-write', asyncRead: boolean): Promise<[number, number]> {
  const w = await SimWorld.create({ scenario, preset: 'dsv4-micro', seed: 3, strategy: 'random', asyncRead });
  await w.run();
  await judgeEnd(w);
  await w.shutdown();
  assert.deepEqual(w.violations, []);
  const stats = (w.D.engine.connector?.worker as OneSidedConnectorWorker).reads.stats;
  return [stats.readsPosted, stats.readsAsync];
}

test('--async-read: decode’s READs are async in a READ scenario; without it none is; a WRITE scenario posts none', async () => {
  const [posted, async] = await decodeReads('1p1d', true);
  assert.ok(posted > 0 && async === posted, `${async} of ${posted} READs async`);
  assert.equal((await decodeReads('1p1d', false))[1], 0);
  assert.deepEqual(await decodeReads('1p1d-write', true), [0, 0]);
});

for (const scenario of ['cancel-everywhere', 'prefix-hit', 'preempt', 'peer-death'] as const)
  test(`--async-read ${scenario}: 12 seeds random and PCT, no violation`, async () => {
    for (const strategy of ['random', 'pct'] as const) {
      const r = await runSim({ scenario, strategy, seeds: 12, asyncRead: true });
      assert.deepEqual(
        r.violations.map((v) => `${strategy} ${v.seed}: ${v.oracle}: ${v.message.slice(0, 200)}`),
        [],
      );
    }
  });

test('--async-read: the seed’s race is caught at seed 1 on 1p1d, and its replay line names the flag', async () => {
  const r = await runSim({
    scenario: '1p1d',
    strategy: 'random',
    seeds: 1,
    mutant: 'zero-none',
    asyncRead: true,
    stopAtFirstFailure: true,
  });
  assert.equal(r.firstFailingSeed, 1);
  assert.match(r.replay ?? '', / --async-read /);
  assert.equal(
    replayCommand({ scenario: '1p1d', strategy: 'random', asyncRead: true }, 1),
    'handoff sim --scenario 1p1d --strategy random --seed 1 --async-read --replay',
  );
});
