/**
 * The xpyd world must reach a decode that lost the prefix its index claimed: a page evicted on a decode
 * (BlockRemoved) between the index update and a request routed by it. Before, every xpyd world's decode had
 * 64 pages for 6 requests of at most 5: nothing was ever evicted, no BlockRemoved was ever published, and
 * no routing decision was ever taken on a claim the decode no longer held (0 stale claims over seeds 1-8).
 * So an index that ignores BlockRemoved (the planted mutant kv-index-ignores-removed) passed every seed,
 * and a decode-only request whose decode had to prefill the prompt itself was never judged against
 * colocated. The decodes' pools are now small enough to evict: the mutant is caught by the router-index
 * oracle, and the correct build answers every request (pd-equals-colocated) with some of them routed on
 * claims the decode no longer held.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { judgeEnd } from './oracles.ts';
import { SimWorld } from './world.ts';
import { runSim } from './run_sim.ts';

test('xpyd: decodes evict, and requests are routed on claims a decode no longer holds; every answer still right', async () => {
  let stale = 0;
  let decodeOnlyStale = 0;
  let removed = 0;
  for (let seed = 1; seed <= 8; seed++) {
    const w = await SimWorld.create({ scenario: 'xpyd', preset: 'dsv4-micro', seed, strategy: 'random' });
    const x = w.xpyd!;
    for (const inst of [w.D, ...w.extra])
      inst.engine.kvEvents.subscribe((b) => (removed += b.events.filter((e) => e.type === 'BlockRemoved').length));
    await w.run();
    await judgeEnd(w);
    await w.shutdown();
    assert.deepEqual(w.violations, [], `seed ${seed}`);
    for (const r of w.proxy.requests) assert.ok(r.outcome?.ok, `seed ${seed} request ${r.spec.index}`);
    stale += x.stats.stale;
    decodeOnlyStale += x.stats.decodeOnlyStale;
  }
  assert.ok(removed > 0, 'an instance evicted a published page');
  assert.ok(stale > 0, 'a request was routed on a claim its instance no longer held');
  assert.ok(decodeOnlyStale > 0, 'a decode-only request reached a decode that had lost pages of its prefix');
});

test('xpyd: an index that ignores BlockRemoved is caught by the router-index oracle', async () => {
  const r = await runSim({
    scenario: 'xpyd',
    strategy: 'random',
    seeds: 8,
    mutant: 'kv-index-ignores-removed',
    jobs: 1,
  });
  assert.notEqual(r.firstFailingSeed, null, 'caught within 8 seeds');
  assert.match(r.violations[0]?.oracle ?? '', /router-index/);
});
