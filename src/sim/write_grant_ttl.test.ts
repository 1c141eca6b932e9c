/**
 * WRITE mode: decode waits `transfer_timeout_ms` for prefill's push into its pages, but the grant it gave
 * prefill for that push lived only decode's `lease_ms` (the producer's setting for held pages). With
 * lease_ms below transfer_timeout_ms (here 10 ms and 15 s; e.g. a kv_both fleet with a short lease) a
 * prefill that pushed after the lease but well inside the timeout was refused (GRANT_DENIED); prefill
 * took the refusal for "decode gave the load up" and said nothing, so decode waited its whole 15 s and
 * then failed the load with a misleading TIMEOUT ("the producer did not write within 15000 ms").
 *
 * Proves: the push that comes inside decode's transfer timeout lands, and the request is served from it.
 * Before the fix the answer had not come 6 s after prefill pushed ('stalled').
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import type { GenerateRequest } from '../engine/llm_engine.ts';
import { PdPair } from './pd_pair.ts';

const env = new RealEnv(5);

test('WRITE: a push inside decode’s transfer timeout lands even when decode’s lease_ms is shorter', async () => {
  const pair = await PdPair.create(
    {
      preset: 'llama-mini',
      modelSeed: 3,
      numBlocks: 128,
      decode: { mode: 'write', leaseMs: 10, transferTimeoutMs: 15_000 },
      raceCheck: false,
      // One sequence at a time: a long local request on prefill keeps the P/D request's prefill waiting.
      scheduler: { maxNumSeqs: 1 },
      name: 'write-ttl',
    },
    env,
  );
  try {
    const blocker: GenerateRequest = {
      promptTokenIds: Array.from({ length: 9 }, (_, k) => 7 + k),
      sampling: { maxTokens: 40, ignoreEos: true },
    };
    let firstToken!: () => void;
    const started = new Promise<void>((resolve) => (firstToken = resolve));
    const long = pair.prefill.generate(blocker, () => firstToken());
    await started;
    const request: GenerateRequest = {
      promptTokenIds: Array.from({ length: 40 }, (_, k) => (k * 37 + 5) % 1000),
      sampling: { maxTokens: 4, ignoreEos: true },
    };
    const pd = pair.generateWrite(request);
    await long; // prefill pushes only now, long after decode granted its pages (40 steps > 10 ms)
    let timer: { cancel(): void } | null = null;
    const stalled = new Promise<'stalled'>((resolve) => (timer = env.setTimer(6_000, () => resolve('stalled'))));
    const got = await Promise.race([pd, stalled]);
    (timer as { cancel(): void } | null)?.cancel();
    assert.notEqual(got, 'stalled', 'decode waits for a push that its own grant refused');
    if (got === 'stalled') return;
    assert.equal(got.tokenIds.length, 4);
    assert.ok(got.numExternalTokens > 0, 'served from prefill’s push, not recomputed');
    assert.equal(pair.decode.scheduler.stats.loadFailures, 0, 'no load failed');
  } finally {
    await pair.close();
  }
});
