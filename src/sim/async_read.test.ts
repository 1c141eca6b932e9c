/**
 * Async READ loads (kv_connector_extra_config.async_read, vLLM's NIXL way): the request waits in
 * WAITING_FOR_REMOTE_KVS while its READ is in flight and the step does not wait for it. Proves, on real
 * threads: P/D output equals colocated logit for logit with no race and no page leaked; a READ that fails
 * is recomputed (or fails by policy); a forged grant is the client's 403; and the seed's race is still
 * there without the fix (zero_exclusion 'none' corrupts, the default does not).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import type { GenerateRequest } from '../engine/llm_engine.ts';
import { colocatedHashes } from './colocated_testkit.ts';
import { PdPair, type PdPairOptions } from './pd_pair.ts';

const env = new RealEnv(4);
const prompts: GenerateRequest[] = [5, 33, 47, 80].map((n, i) => ({
  promptTokenIds: Array.from({ length: n }, (_, k) => (i * 977 + k * 31) % 50000),
  sampling: { maxTokens: 5, temperature: i % 2 ? 0.9 : 0, seed: 3 + i, ignoreEos: true },
}));

const reference = (list: GenerateRequest[] = prompts): Promise<string[]> => colocatedHashes(env, list);

const base = (name: string, over: Partial<PdPairOptions> = {}): PdPairOptions => ({
  preset: 'dsv4-mini',
  modelSeed: 2,
  numBlocks: 128,
  raceCheck: true,
  name,
  ...over,
  decode: { asyncRead: true, ...over.decode },
});

async function settleAndCount(pair: PdPair): Promise<void> {
  for (let k = 0; k < 400 && !(pair.prefill.core.isIdle() && pair.decode.core.isIdle()); k++) await env.sleep(5);
  assert.equal(pair.prefill.kv.getNumFreeBlocks(), 127, 'prefill pages back');
  assert.equal(pair.decode.kv.getNumFreeBlocks(), 127, 'decode pages back');
}

test('async READ: P/D output equals colocated, the loads were async, no race, no leak', async () => {
  const ref = await reference();
  const pair = await PdPair.create(base('async-read'), env);
  try {
    const got = await Promise.all(prompts.map((p) => pair.generate(p)));
    got.forEach((r, i) => assert.equal(r.logitsHashes.join(','), ref[i], `request ${i}`));
    assert.ok(
      got.some((r) => r.numExternalTokens > 0),
      'KV came from prefill',
    );
    assert.equal((pair.decode.device.raceChecker as unknown as { races(): unknown[] }).races().length, 0);
    const stats = pair.decodeConnector.worker.stats;
    assert.ok(
      stats.readsPosted >= 3 && stats.readsAsync === stats.readsPosted,
      `async READs: ${JSON.stringify(stats)}`,
    );
    await settleAndCount(pair);
  } finally {
    await pair.close();
  }
});

test('async READ failures: recomputed locally (colocated output), or KV_LOAD_FAILED by policy; decode keeps serving', async () => {
  const ref = await reference();
  const pair = await PdPair.create(base('async-readfail', { decode: { faults: { readErrorRate: 1 } } }), env);
  try {
    const got = await Promise.all(prompts.map((p) => pair.generate(p)));
    got.forEach((r, i) => assert.equal(r.logitsHashes.join(','), ref[i], `request ${i} recomputed locally`));
    assert.ok(pair.decode.scheduler.stats.loadFailures >= 3, 'the loads did fail');
    await settleAndCount(pair);
  } finally {
    await pair.close();
  }
  const strict = await PdPair.create(
    base('async-readfail-strict', {
      decode: { faults: { readErrorRate: 1 } },
      scheduler: { kvLoadFailurePolicy: 'fail' },
    }),
    env,
  );
  try {
    await assert.rejects(
      strict.generate(prompts[2] as GenerateRequest),
      (e: Error & { code?: string }) => e.code === 'KV_LOAD_FAILED',
    );
    assert.equal((await strict.decode.generate(prompts[0] as GenerateRequest)).tokenIds.length, 5, 'keeps serving');
    await settleAndCount(strict);
  } finally {
    await strict.close();
  }
});

test('async READ with a forged grant: the client fault (GRANT_DENIED), pages back', async () => {
  const pair = await PdPair.create(base('async-forged'), env);
  try {
    const r = await pair.prefill.generate({
      ...(prompts[3] as GenerateRequest),
      sampling: { maxTokens: 1 },
      kvTransferParams: { do_remote_decode: true, transfer_id: 'forged-1' },
    });
    const params = { ...r.kvTransferParams, grant: 'f'.repeat(32) };
    await assert.rejects(
      pair.decode.generate({ ...(prompts[3] as GenerateRequest), kvTransferParams: params }),
      (e: Error & { code?: string }) => e.code === 'GRANT_DENIED',
    );
    // The real grant is never used: prefill's lease would free it; release it by reading it properly.
    await pair.decode.generate({ ...(prompts[3] as GenerateRequest), kvTransferParams: r.kvTransferParams });
    await settleAndCount(pair);
  } finally {
    await pair.close();
  }
});

test("async READ keeps the seed's race: without the zeroing exclusion the received KV is wiped, with it exact", async () => {
  // One long decode keeps the compute stream busy; the others arrive while it runs, so their pages' zeroing
  // queues behind its forwards while their READs land.
  const list: GenerateRequest[] = [
    { promptTokenIds: [11, 12, 13], sampling: { maxTokens: 40, temperature: 0, ignoreEos: true } },
    ...prompts,
    ...prompts.map((p, i) => ({ ...p, promptTokenIds: p.promptTokenIds.map((t) => (t + 7 * i + 1) % 50000) })),
  ];
  const ref = await reference(list);
  const runWith = async (zeroExclusion: 'none' | 'all-read-groups'): Promise<number> => {
    const pair = await PdPair.create(
      base(`async-ab-${zeroExclusion}`, { raceCheck: false, decode: { zeroExclusion }, decodeForwardPadMs: 15 }),
      env,
    );
    try {
      const got = await Promise.all(list.map(async (p, i) => (await env.sleep(i * 12), pair.generate(p))));
      return got.filter((r, i) => r.logitsHashes.join(',') !== ref[i]).length;
    } finally {
      await pair.close();
    }
  };
  assert.equal(await runWith('all-read-groups'), 0, 'with the fix every answer is exact');
  assert.ok((await runWith('none')) > 0, 'without the fix some answer is corrupt');
});
