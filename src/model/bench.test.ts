/**
 * Proves benchModel measures something real and reports it in the agreed shape: positive, finite
 * throughput and roofline from the injected clock, and ratio = gflops / rooflineGflops. (No timing
 * thresholds: only shape and consistency.)
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { benchModel, benchTensorParallel } from './bench.ts';

test('benchModel: positive finite figures, ratio consistent with its parts', async () => {
  const r = await benchModel({ preset: 'llama-mini', env: new RealEnv(1), tokens: 8 });
  assert.equal(r.preset, 'llama-mini');
  for (const k of ['tokensPerSec', 'gflops', 'rooflineGflops', 'ratio'] as const)
    assert.ok(Number.isFinite(r[k]) && r[k] > 0, `${k} = ${r[k]}`);
  assert.ok(Math.abs(r.ratio - r.gflops / r.rooflineGflops) < 1e-12);
});

test('benchModel: rejects a token count outside 1..8192', async () => {
  await assert.rejects(benchModel({ preset: 'llama-mini', env: new RealEnv(1), tokens: 0 }), /bench tokens/);
});

test('benchTensorParallel: TP=1 and TP=2 on the threaded device, positive finite rates, speedup = their ratio', async () => {
  const r = await benchTensorParallel({
    preset: 'llama-micro',
    env: new RealEnv(1),
    tokens: 8,
    tensorParallelSize: 2,
    reps: 1,
  });
  assert.equal(r.tensorParallelSize, 2);
  for (const k of ['tp1TokensPerSec', 'tpTokensPerSec', 'speedup', 'threadScaling'] as const)
    assert.ok(Number.isFinite(r[k]) && r[k] > 0, `${k} = ${r[k]}`);
  assert.ok(Math.abs(r.speedup - r.tpTokensPerSec / r.tp1TokensPerSec) < 1e-12);
});
