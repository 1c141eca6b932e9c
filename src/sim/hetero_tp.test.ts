/**
 * P/D between tensor parallel degrees (issue 14, `--prefill-tp` / `--decode-tp`): the table, every
 * pairing of TP {1, 2} on each side x block size {8, 16, 32} on each side x each micro preset, passes
 * every oracle on hetero-tp with one seed per cell, injected faults off so every load runs (race checker
 * silent, page lifecycle I1-I7, P/D == colocated at TP=1 token for token and logit for logit, liveness,
 * leaks), READ and WRITE each (READ only on the Mamba hybrid); the loads really move the KV between
 * degrees (none fails, clipped tails are zeroed on every decode rank); the bug zoo's two wrong maps are
 * caught at both unequal pairings; the scenario draws its degrees, sizes and mode from the seed unless told.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MICRO_PRESETS, kvTwin, type ModelPreset } from '../kv/presets.ts';
import { runSim } from './run_sim.ts';
import { buildScenario, HETERO_TP_PAIRINGS, TP_BLOCK_PAIRINGS } from './scenarios.ts';
import { tallyWorlds } from './load_tally.ts';

const SIZES = [8, 16, 32];
const DEGREES = [1, 2];

/** The first seed of hetero-tp whose drawn mode is `mode` (the degrees and sizes come from the options). */
function seedWithMode(model: ModelPreset, mode: 'read' | 'write'): number {
  for (let seed = 1; seed <= 40; seed++) if (buildScenario('hetero-tp', model, seed).mode === mode) return seed;
  return assert.fail(`no seed of 1-40 draws ${mode} on ${model}`);
}

for (const model of MICRO_PRESETS) {
  test(`TP table, ${model}: TP {1,2} x block {8,16,32} on each side passes every oracle on hetero-tp`, async () => {
    const modes = kvTwin(model) === 'hybrid-mini' ? (['read'] as const) : (['read', 'write'] as const);
    for (const mode of modes)
      for (const prefillTp of DEGREES)
        for (const decodeTp of DEGREES)
          for (const prefillBlockSize of SIZES)
            for (const decodeBlockSize of SIZES) {
              const seed = seedWithMode(model, mode);
              const r = await runSim({
                scenario: 'hetero-tp',
                strategy: 'random',
                seeds: 1,
                seed,
                faults: false, // every load runs (an injected READ failure would recompute instead)
                model,
                prefillTp,
                decodeTp,
                prefillBlockSize,
                decodeBlockSize,
              });
              const what = `${mode} P TP${prefillTp} bs${prefillBlockSize} / D TP${decodeTp} bs${decodeBlockSize}`;
              assert.equal(r.schedules, 1, what);
              assert.equal(r.firstFailingSeed, null, `${what}: ${r.violations[0]?.message ?? ''}`);
            }
  });
}

/** Runs hetero-tp seeds and sums what the connectors and decode's scheduler counted. */
async function loads(model: ModelPreset, tp: [number, number], sizes: [number, number], seeds: number[]) {
  let ranks = 0;
  const sum = await tallyWorlds(
    seeds,
    (seed) => ({
      scenario: 'hetero-tp',
      preset: model,
      seed,
      strategy: 'random',
      faults: false,
      prefillTp: tp[0],
      decodeTp: tp[1],
      prefillBlockSize: sizes[0],
      decodeBlockSize: sizes[1],
    }),
    (w) => (ranks = w.D.kvConfig.tensorParallelSize),
  );
  return { ...sum, ranks };
}

test('hetero-tp: the KV really moves between degrees (READs and WRITEs, none fails); larger decode pages get their tails zeroed', async () => {
  const [read, write] = [seedWithMode('dsv4-micro', 'read'), seedWithMode('dsv4-micro', 'write')];
  for (const tp of [
    [2, 1],
    [1, 2],
  ] as Array<[number, number]>) {
    const up = await loads('dsv4-micro', tp, [8, 32], [read, write]);
    assert.deepEqual(
      { ...up, tails: up.tails > 0 },
      { violations: 0, reads: 4, writes: 4, failed: 0, tails: true, ranks: tp[1] },
      `P TP${tp[0]} / D TP${tp[1]}`,
    );
    const down = await loads('dsv4-micro', tp, [32, 8], [read, write]);
    assert.deepEqual(down, { violations: 0, reads: 4, writes: 4, failed: 0, tails: 0, ranks: tp[1] });
  }
});

test('the bug zoo between degrees: a head-major map and a slice off by one are caught at P2/D1 and P1/D2, READ and WRITE', async () => {
  for (const mutant of ['head-layout-mismatch', 'tp-slice-off-by-one'] as const)
    for (const [prefillTp, decodeTp] of HETERO_TP_PAIRINGS)
      for (const mode of ['read', 'write'] as const) {
        const r = await runSim({
          scenario: 'hetero-tp',
          strategy: 'random',
          seeds: 1,
          seed: seedWithMode('dsv4-micro', mode),
          faults: false,
          prefillTp,
          decodeTp,
          mutant,
        });
        assert.notEqual(r.firstFailingSeed, null, `${mutant} ${mode} P TP${prefillTp} / D TP${decodeTp} escaped`);
        assert.match(r.replay ?? '', new RegExp(`--prefill-tp ${prefillTp} --decode-tp ${decodeTp} --replay$`));
      }
  // The tail zeroing is still needed, on every decode rank: forgetting it is caught at D TP 2 too.
  const clip = await runSim({
    scenario: 'hetero-tp',
    strategy: 'random',
    seeds: 1,
    seed: seedWithMode('dsv4-micro', 'read'),
    faults: false,
    prefillTp: 1,
    decodeTp: 2,
    prefillBlockSize: 8,
    decodeBlockSize: 32,
    mutant: 'clip-tail-not-zeroed',
  });
  assert.ok(
    clip.violations.some((v) => v.invariant === 'I2'),
    'a stale clipped tail is read',
  );
});

test('hetero-tp draws unequal degrees, every block pairing and both modes from the seed unless the options name them', () => {
  const [tps, sizes, modes] = [new Set<string>(), new Set<string>(), new Set<string>()];
  for (let seed = 1; seed <= 60; seed++) {
    const c = buildScenario('hetero-tp', 'dsv4-micro', seed);
    assert.notEqual(c.prefill.tensorParallelSize, c.decode.tensorParallelSize);
    tps.add(`${c.prefill.tensorParallelSize}/${c.decode.tensorParallelSize}`);
    sizes.add(`${c.prefill.blockSize}/${c.decode.blockSize}`);
    modes.add(c.mode);
  }
  assert.equal(tps.size, HETERO_TP_PAIRINGS.length);
  assert.equal(sizes.size, TP_BLOCK_PAIRINGS.length);
  assert.deepEqual([...modes].sort(), ['read', 'write']);
  const fixed = buildScenario('hetero-tp', 'llama-micro', 1, { prefillTp: 2, decodeTp: 2, blockSize: 8 });
  assert.deepEqual(
    [
      fixed.prefill.tensorParallelSize,
      fixed.decode.tensorParallelSize,
      fixed.prefill.blockSize,
      fixed.decode.blockSize,
    ],
    [2, 2, 8, 8],
  );
  for (let seed = 1; seed <= 10; seed++) assert.equal(buildScenario('hetero-tp', 'hybrid-micro', seed).mode, 'read');
});
