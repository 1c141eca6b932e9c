/**
 * The xpyd scenario does what it claims, over seeds 1-8: 2 prefills and 2 decodes all serve; the
 * router takes decode-only routes; KV event batches are lost, duplicated and delivered out of order;
 * gaps are repaired by dumps; a decode restarts (a new epoch); and through all of it the router-index
 * oracle holds. With the index ignoring sequence numbers (mutant kv-index-ignores-seq) the oracle fires.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { judgeEnd } from './oracles.ts';
import { SimWorld } from './world.ts';
import { runSim } from './run_sim.ts';

test('xpyd: every kind of event fault and a restart happen over seeds 1-8, and the router-index oracle holds', async () => {
  const sum = { batches: 0, dropped: 0, duplicated: 0, dumps: 0, restarts: 0, decodeOnly: 0, reordered: 0, epochs: 0 };
  const served = new Set<string>();
  for (let seed = 1; seed <= 8; seed++) {
    const w = await SimWorld.create({ scenario: 'xpyd', preset: 'dsv4-micro', seed, strategy: 'random' });
    await w.run();
    await judgeEnd(w);
    await w.shutdown();
    assert.deepEqual(w.violations, [], `seed ${seed}`);
    const x = w.xpyd!;
    for (const k of ['batches', 'dropped', 'duplicated', 'dumps', 'restarts', 'decodeOnly'] as const)
      sum[k] += x.stats[k];
    sum.reordered += x.index.stats.buffered;
    sum.epochs += x.index.stats.epochs;
    for (const r of w.proxy.requests) {
      assert.ok(r.outcome?.ok, `seed ${seed} request ${r.spec.index}: ${r.outcome?.errorMessage}`);
      if (r.route?.prefill) served.add(r.route.prefill.name.replace(/r$/, ''));
      if (r.route?.decode) served.add(r.route.decode.name.replace(/r$/, ''));
    }
  }
  for (const [k, v] of Object.entries(sum)) assert.ok(v > 0, `${k} happened at least once (${JSON.stringify(sum)})`);
  assert.deepEqual([...served].sort(), ['D', 'D1', 'P', 'P1'], 'all four instances served');
});

test('xpyd: an index that ignores sequence numbers is caught by the router-index oracle', async () => {
  const r = await runSim({ scenario: 'xpyd', strategy: 'random', seeds: 8, mutant: 'kv-index-ignores-seq', jobs: 1 });
  assert.notEqual(r.firstFailingSeed, null, 'caught within 8 seeds');
  assert.match(r.violations[0]?.oracle ?? '', /router-index/);
});
