/**
 * PCT (Burckhardt et al. 2010) draws d-1 *distinct* priority change points over the run's k
 * steps. With every agent always enabled (more agents than change points), each change point hands
 * the run over to another agent, so a run of k+1 picks must show exactly d-1 hand-overs, every seed.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createExplorer, type ChoiceInfo } from './explorer.ts';

const choices: ChoiceInfo[] = ['a', 'b', 'c', 'd', 'e', 'f'].map((agent) => ({ key: `${agent}#0`, agent }));

function handOvers(seed: number, depth: number, k: number): number {
  const e = createExplorer('pct', seed, { pctDepth: depth, pctSteps: k });
  let prev = -1;
  let n = 0;
  for (let step = 0; step <= k; step++) {
    const p = e.pick(choices);
    if (prev !== -1 && p !== prev) n++;
    prev = p;
  }
  return n;
}

test('pct: every seed gets d-1 distinct change points (no two on the same step)', () => {
  for (const [depth, k] of [
    [3, 10],
    [3, 60],
    [4, 20],
  ] as const) {
    const short: number[] = [];
    for (let seed = 1; seed <= 300; seed++) if (handOvers(seed, depth, k) !== depth - 1) short.push(seed);
    assert.deepEqual(short, [], `depth ${depth}, k ${k}: seeds with fewer than ${depth - 1} change points`);
  }
});

test('pct: change points can land on every step of a run (k covers xpyd and tight-write runs, which exceed 60 steps)', async () => {
  const { SimWorld } = await import('./world.ts');
  const { DEFAULT_SIM_PRESET } = await import('./run_sim.ts');
  for (const scenario of ['xpyd', 'tight-write'] as const) {
    const mk = (seed: number) =>
      SimWorld.create({ scenario, preset: DEFAULT_SIM_PRESET, seed, strategy: 'pct', stopOnViolation: true });
    let longest = 0;
    for (let seed = 1; seed <= 6; seed++) {
      const w = await mk(seed);
      await w.run();
      await w.shutdown();
      longest = Math.max(longest, w.step);
    }
    assert.ok(longest > 60, `${scenario} runs are longer than 60 steps (${longest})`);
    // The world's own PCT explorer, probed with every agent always enabled: where do its change points fall?
    let lastChange = -1;
    for (let seed = 1; seed <= 40; seed++) {
      const w = await mk(seed);
      let prev = -1;
      for (let step = 0; step <= longest; step++) {
        const p = w.explorer.pick(choices);
        if (prev !== -1 && p !== prev) lastChange = Math.max(lastChange, step - 1);
        prev = p;
      }
      await w.shutdown();
    }
    assert.ok(
      lastChange >= 60,
      `${scenario}: over 40 seeds no change point after step ${lastChange}, though runs take up to ${longest} steps`,
    );
  }
});
