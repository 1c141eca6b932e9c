/**
 * Session 14: a request that stops on a stop token or EOS before max_tokens was never
 * run through P/D by the simulator (every scenario's requests had ignore_eos and no stop tokens), so the
 * planted mistake "prefill hands its KV to decode only when it stopped on max_tokens" (vLLM's NIXL
 * connector check; mutant stop-no-handoff) escaped every scenario, model and strategy of the sweep
 * (`sim --scenario all --strategy random,pct --seeds 40`: no violation), while it breaks serving:
 *   READ   a client whose prefill token is a stop token gets TRANSFER_FAILED ("prefill answered without
 *          kv_transfer_params") for a valid request (shown below on the threaded P/D pair);
 *   WRITE  decode waits for a push that never comes, for the whole transfer timeout (30 s by default),
 *          then recomputes the prompt: output right, so P/D == colocated stayed silent.
 * The fix is the `stop-token` scenario (each request stops on the token its colocated run samples at a
 * drawn output index, the first request on prefill's own token) and a liveness check that an undisturbed
 * run has no failed (locally recomputed) load. Before it, `stop-token` did not exist and this file failed;
 * with the scenario alone, WRITE seeds (1, 3, 10) still passed.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { threadedDevice } from '../engine/devices.ts';
import { LLMEngine, type GenerateRequest } from '../engine/llm_engine.ts';
import { isHandoffError } from '../util/errors.ts';
import { PdPair } from './pd_pair.ts';
import { runSim } from './run_sim.ts';

test('stop-token catches stop-no-handoff at seed 1, random and PCT (the WRITE seed: a load recomputed)', async () => {
  for (const strategy of ['random', 'pct'] as const) {
    const r = await runSim({ scenario: 'stop-token', strategy, seeds: 1, mutant: 'stop-no-handoff' });
    assert.equal(r.firstFailingSeed, 1, `${strategy}: stop-no-handoff escaped seed 1`);
    assert.ok(
      r.violations.some((v) => v.oracle === 'liveness' && /KV load\(s\) failed/.test(v.message)),
      r.violations.map((v) => v.message).join('; '),
    );
  }
});

test('stop-token catches stop-no-handoff on a READ seed as TRANSFER_FAILED (seed 11)', async () => {
  const r = await runSim({ scenario: 'stop-token', strategy: 'random', seed: 11, seeds: 1, mutant: 'stop-no-handoff' });
  assert.ok(
    r.violations.some((v) => v.oracle === 'liveness' && /TRANSFER_FAILED/.test(v.message)),
    r.violations.map((v) => v.message).join('; ') || 'no violation',
  );
});

test('stop-token: the correct build stops early in P/D exactly as colocated, every load landing', async () => {
  const r = await runSim({ scenario: 'stop-token', strategy: 'random', seeds: 12 });
  assert.deepEqual(
    r.violations.map((v) => v.message),
    [],
  );
});

test('the plant breaks real serving: a READ whose prefill token is a stop token fails with TRANSFER_FAILED', async () => {
  const env = new RealEnv(4);
  const preset = 'dsv4-mini';
  const base: GenerateRequest = {
    promptTokenIds: Array.from({ length: 21 }, (_, k) => (k * 131 + 7) % 50000),
    sampling: { maxTokens: 4, temperature: 0, seed: 1, ignoreEos: true },
  };
  const colocated = await LLMEngine.create(
    {
      preset,
      modelSeed: 2,
      numBlocks: 64,
      asyncScheduling: true,
      scheduler: {},
      idlePollMs: 2,
      makeDevice: threadedDevice(preset, 2),
    },
    env,
  );
  let first: number;
  try {
    first = (await colocated.generate(base)).tokenIds[0] as number;
  } finally {
    await colocated.close();
  }
  const g: GenerateRequest = { ...base, sampling: { ...base.sampling, stopTokenIds: [first] } };
  const outcome = async (mutant: boolean): Promise<string> => {
    const pair = await PdPair.create(
      {
        preset,
        modelSeed: 2,
        numBlocks: 64,
        decode: {},
        prefill: mutant ? { mutant: 'stop-no-handoff' } : {},
        raceCheck: false,
        name: `stop-token-${mutant}`,
      },
      env,
    );
    try {
      const r = await pair.generate(g);
      return `${r.finishReason} ${r.tokenIds.join(',')}`;
    } catch (e) {
      return isHandoffError(e) ? e.code : String(e);
    } finally {
      await pair.close();
    }
  };
  assert.equal(await outcome(false), `stop ${first}`);
  assert.equal(await outcome(true), 'TRANSFER_FAILED');
});
