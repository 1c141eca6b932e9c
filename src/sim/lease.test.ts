/**
 * Prefill's lease vs decode's queue. Prefill holds a request's pages for `leaseMs` and answers
 * `grant_expires_ms`; a decode that is busy (here: one sequence at a time, a long request running) keeps
 * the P/D request waiting past that time, so its READ meets a grant the lease already ended and the NIC
 * answers GRANT_DENIED. That is a server-side timing problem, not the client's fault (the proxy made the
 * params): the load failure follows kvLoadFailurePolicy (recompute → the colocated answer; fail →
 * KV_LOAD_FAILED 502) instead of a 403 GRANT_DENIED. A grant that was never issued (forged) is still a 403.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { RealEnv } from '../util/env.ts';
import type { GenerateRequest } from '../engine/llm_engine.ts';
import { PdPair, type PdPairOptions } from './pd_pair.ts';
import { colocatedHashes } from './colocated_testkit.ts';

const env = new RealEnv(12);
const LEASE_MS = 150;
const prompt: GenerateRequest = {
  promptTokenIds: Array.from({ length: 47 }, (_, k) => (977 + k * 31) % 50000),
  sampling: { maxTokens: 5, temperature: 0, seed: 3, ignoreEos: true },
};
/** A local request that keeps decode's only sequence slot busy well past the lease. */
const blocker: GenerateRequest = {
  promptTokenIds: Array.from({ length: 9 }, (_, k) => 7 + k),
  sampling: { maxTokens: 80, temperature: 0, ignoreEos: true },
};

async function reference(): Promise<string> {
  return (await colocatedHashes(env, [prompt]))[0] as string;
}

const options = (name: string, policy: 'recompute' | 'fail'): PdPairOptions => ({
  preset: 'dsv4-mini',
  modelSeed: 2,
  numBlocks: 128,
  decode: {},
  prefill: { leaseMs: LEASE_MS },
  scheduler: { kvLoadFailurePolicy: policy },
  decodeScheduler: { maxNumSeqs: 1 },
  decodeForwardPadMs: 4,
  raceCheck: false,
  name,
});

/** The P/D request, sent while decode is busy with the blocker: it waits in decode's queue past the lease. */
async function behindBlocker(pair: PdPair): Promise<PromiseSettledResult<{ logitsHashes: number[] | string[] }>> {
  const busy = pair.decode.generate(blocker);
  const [, pd] = await Promise.allSettled([busy, pair.generate(prompt)]);
  return pd as PromiseSettledResult<{ logitsHashes: number[] | string[] }>;
}

async function settleAndCheckPages(pair: PdPair): Promise<void> {
  for (let k = 0; k < 400 && !(pair.prefill.core.isIdle() && pair.decode.core.isIdle()); k++) await env.sleep(5);
  for (let k = 0; k < 200 && pair.prefill.kv.getNumFreeBlocks() < 127; k++) await env.sleep(5);
  assert.equal(pair.prefill.kv.getNumFreeBlocks(), 127, 'prefill pages back');
  assert.equal(pair.decode.kv.getNumFreeBlocks(), 127, 'decode pages back');
}

test('a P/D request that waited in decode’s queue past prefill’s lease is recomputed (policy recompute), not a 403', async () => {
  const ref = await reference();
  const pair = await PdPair.create(options('lease-queue', 'recompute'), env);
  try {
    const pd = await behindBlocker(pair);
    assert.ok(pair.prefillConnector.scheduler.stats.leasesExpired >= 1, 'the lease did end while the request waited');
    assert.equal(
      pd.status,
      'fulfilled',
      `answered, not refused: ${pd.status === 'rejected' ? String((pd.reason as Error).message) : ''}`,
    );
    assert.equal(pd.status === 'fulfilled' && pd.value.logitsHashes.join(','), ref, 'the colocated answer');
    assert.ok(pair.decode.scheduler.stats.loadFailures >= 1, 'the load did fail (and was recomputed)');
    await settleAndCheckPages(pair);
  } finally {
    await pair.close();
  }
});

test('the same with kvLoadFailurePolicy fail: KV_LOAD_FAILED (502), not GRANT_DENIED (403)', async () => {
  const pair = await PdPair.create(options('lease-queue-fail', 'fail'), env);
  try {
    const pd = await behindBlocker(pair);
    assert.equal(pd.status, 'rejected');
    const e = (pd as PromiseRejectedResult).reason as Error & { code?: string; httpStatus?: number };
    assert.deepEqual([e.code, e.httpStatus], ['KV_LOAD_FAILED', 502], e.message);
    await settleAndCheckPages(pair);
  } finally {
    await pair.close();
  }
});

test('a forged grant (never issued) is still the client’s fault: 403 GRANT_DENIED', async () => {
  // A lease long enough that the real grant is live throughout: each refusal is before grant_expires_ms.
  const pair = await PdPair.create({ ...options('lease-forged', 'recompute'), prefill: { leaseMs: 60_000 } }, env);
  try {
    const pre = await pair.prefill.generate({
      ...prompt,
      sampling: { maxTokens: 1 },
      kvTransferParams: { do_remote_decode: true, transfer_id: 'forged-1' },
    });
    const real = pre.kvTransferParams as Record<string, unknown>;
    const forged = { ...real, grant: randomBytes(16).toString('hex') };
    await assert.rejects(
      pair.decode.generate({ ...prompt, kvTransferParams: forged }),
      (e: Error & { code?: string; httpStatus?: number }) => e.code === 'GRANT_DENIED' && e.httpStatus === 403,
      'forged grant within the lease',
    );
    const unknown = { ...real, transfer_id: 'never-issued' };
    await assert.rejects(
      pair.decode.generate({ ...prompt, kvTransferParams: unknown }),
      (e: Error & { code?: string; httpStatus?: number }) => e.code === 'GRANT_DENIED' && e.httpStatus === 403,
      'a transfer prefill never granted',
    );
    // The rightful params still load (and release prefill's pages).
    const ok = await pair.decode.generate({ ...prompt, kvTransferParams: real });
    assert.ok(ok.numExternalTokens > 0, 'loaded from prefill');
    await settleAndCheckPages(pair);
  } finally {
    await pair.close();
  }
});
