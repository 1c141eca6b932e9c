/**
 * Clock skew between prefill and decode (two hosts): a READ refused because prefill's lease ended is no
 * fault of the client's (the request waited on decode longer than prefill holds pages), so decode
 * recomputes it (kvLoadFailurePolicy 'recompute'), as pd_pair.test.ts's lease test shows on one clock.
 *
 * Before the fix, decode judged "the lease ended" only by comparing prefill's wall clock
 * (grant_expires_ms) with its own: with decode's wall clock 5 s behind prefill's (NTP off, a VM resumed)
 * the lapsed grant looked live, the refusal stayed GRANT_DENIED and the client got a 403
 * ("kv_transfer_params rejected: no live grant for transfer ...") for params that were good when issued.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import type { GenerateRequest } from '../engine/llm_engine.ts';
import { PdPair, type PdPairOptions } from './pd_pair.ts';

/** Another host's clocks: monotonic time is its own anyway; its wall clock is `skewMs` off. */
class SkewedEnv extends RealEnv {
  constructor(
    seed: number,
    private readonly skewMs: number,
  ) {
    super(seed);
  }
  override wallMs(): number {
    return super.wallMs() + this.skewMs;
  }
}

const env = new RealEnv(7);
const prompt: GenerateRequest = {
  promptTokenIds: Array.from({ length: 80 }, (_, k) => (k * 31 + 5) % 50000),
  sampling: { maxTokens: 5, temperature: 0, seed: 3, ignoreEos: true },
};

const options = (name: string, decodeSkewMs: number): PdPairOptions => ({
  preset: 'dsv4-mini',
  modelSeed: 2,
  numBlocks: 128,
  decode: {},
  prefill: { leaseMs: 300 },
  raceCheck: false,
  name,
  // Decode runs one request at a time, each step 10 ms longer: a long request keeps the next one waiting.
  decodeScheduler: { maxNumSeqs: 1 },
  decodeForwardPadMs: 10,
  decodeEnv: new SkewedEnv(8, decodeSkewMs),
});

/** prefill answers; the request then waits on decode behind a long one, past prefill's lease, and READs. */
async function waitedPastLease(pair: PdPair): Promise<number> {
  const blocker = { ...prompt, promptTokenIds: prompt.promptTokenIds.slice(0, 9), sampling: { maxTokens: 40 } };
  let firstToken!: () => void;
  const started = new Promise<void>((resolve) => (firstToken = resolve));
  const long = pair.decode.generate(blocker, () => firstToken());
  await started;
  const r = await pair.prefill.generate({
    ...prompt,
    sampling: { maxTokens: 1 },
    kvTransferParams: { do_remote_decode: true, transfer_id: `skew-${pair.decodeConnector.transfer.engineId}` },
  });
  assert.ok(r.kvTransferParams?.['grant'], 'a grant was issued');
  const late = pair.decode.generate({ ...prompt, kvTransferParams: r.kvTransferParams });
  assert.equal((await long).tokenIds.length, 40);
  const leasesExpired = pair.prefillConnector.scheduler.stats.leasesExpired;
  assert.equal(leasesExpired, 1, 'the lease ended while the request waited on decode (40 steps of 10+ ms > 300 ms)');
  const tokens = await late.then(
    (g) => g.tokenIds.length,
    (e: Error & { code?: string }) => `${e.code}: ${e.message}`,
  );
  return typeof tokens === 'number' ? tokens : assert.fail(tokens);
}

// With skew 0 (one clock) the same scenario passed before the fix too (lease.test.ts).
test('decode 5000 ms behind prefill: a READ refused once the lease ended is recomputed, not a 403', async () => {
  const pair = await PdPair.create(options('skew5000', -5000), env);
  try {
    assert.equal(await waitedPastLease(pair), 5, 'answered by a local recompute');
    assert.ok(pair.decode.scheduler.stats.loadFailures >= 1, 'the READ did fail');
    assert.ok(pair.prefillConnector.transfer.stats().grantsRefused >= 1, 'prefill refused the dead grant');
  } finally {
    await pair.close();
  }
});
