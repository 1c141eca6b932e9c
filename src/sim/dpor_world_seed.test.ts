/**
 * Proves: `sim --strategy dpor --seed N` explores world N. The search built every world from
 * seed 0 whatever `--seed` said, so the scenario's seed draws were fixed: hetero-tp's seed 0 is a WRITE
 * world, and no DPOR run could explore a READ between tensor parallel degrees (its clipped-tail zeroing
 * after the READ landed, read_consumer.ts). A READ-side mutant (`read-done-early`: forward and release go
 * on the post's local ack) then passed "space exhausted" with `--seed` naming a READ world. Before the
 * fix: no violation, and the replay line said `--seed 0`.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runDpor } from './dpor_run.ts';
import { buildScenario } from './scenarios.ts';

test('dpor --seed N explores the world seed N draws (a READ world of hetero-tp at P TP1 / D TP2)', async () => {
  let seed = 1;
  while (buildScenario('hetero-tp', 'dsv4-micro', seed, { requests: 1 }).mode !== 'read') seed++;
  assert.equal(buildScenario('hetero-tp', 'dsv4-micro', 0, { requests: 1 }).mode, 'write', 'seed 0 is a WRITE world');
  const r = await runDpor({
    scenario: 'hetero-tp',
    strategy: 'dpor',
    seeds: 1,
    seed,
    requests: 1,
    faults: false,
    prefillTp: 1,
    decodeTp: 2,
    prefillBlockSize: 8,
    decodeBlockSize: 32,
    mutant: 'read-done-early',
    stopAtFirstFailure: true,
  });
  assert.ok(r.violations.length > 0, `read-done-early escaped ${r.schedules} schedules of seed ${seed}`);
  assert.match(r.replay ?? '', new RegExp(`--seed ${seed} `));
});
