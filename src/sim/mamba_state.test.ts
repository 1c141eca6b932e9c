/**
 * Review (session 16): a Mamba state handoff bug escaped `sim --scenario all` and the bug zoo. Every
 * scenario ran the default model (dsv4-micro, attention only), so no READ ever moved a Mamba state page:
 * a decode that never loaded prefill's state page (mutant mamba-state-dropped: it goes on from a zeroed
 * h(N-1)) passed every scenario on the default model, while --model hybrid-micro failed all of them.
 *
 * Proves: `--scenario all` on the default model holds a scenario whose world runs a Mamba model, and the
 * simulator catches mamba-state-dropped there on seed 1 (I2, or P/D != colocated; the correct build passes it).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { kvTwin } from '../kv/presets.ts';
import { DEFAULT_SIM_PRESET, runSim } from './run_sim.ts';
import { buildScenario, SCENARIOS } from './scenarios.ts';

test('sim --scenario all on the default model plays a Mamba model in some scenario', () => {
  const mamba = SCENARIOS.filter((s) => kvTwin(buildScenario(s, DEFAULT_SIM_PRESET, 1).preset) === 'hybrid-mini');
  assert.ok(mamba.length > 0, `no scenario of ${SCENARIOS.join(', ')} runs a Mamba model on ${DEFAULT_SIM_PRESET}`);
});

test('mamba-state-dropped is caught on the default model; the correct build passes the same seeds', async () => {
  const scenario = SCENARIOS.find((s) => kvTwin(buildScenario(s, DEFAULT_SIM_PRESET, 1).preset) === 'hybrid-mini');
  assert.ok(scenario !== undefined, 'a Mamba scenario');
  const bad = await runSim({ scenario, strategy: 'random', seeds: 1, mutant: 'mamba-state-dropped' });
  assert.equal(bad.firstFailingSeed, 1);
  // The page lifecycle checker sees the state page read unwritten (I2); the accuracy oracle, the wrong tokens.
  assert.ok(
    bad.violations.some((v) => v.oracle === 'pd-equals-colocated' || v.invariant === 'I2'),
    JSON.stringify(bad.violations),
  );
  const ok = await runSim({ scenario, strategy: 'random', seeds: 2 });
  assert.equal(ok.firstFailingSeed, null, JSON.stringify(ok.violations));
});
