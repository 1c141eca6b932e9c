/**
 * 1P1D in one process with real threads: WRITE mode equals colocated; a READ that fails is recovered by
 * local recompute (same output as colocated) or fails with KV_LOAD_FAILED by policy; a decode that never
 * reads does not strand prefill's pages (the lease frees them and kills the grant), and a READ with the dead
 * grant is refused (the request is recomputed locally: the lease ended, not the client's fault) while decode
 * keeps serving.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import type { GenerateRequest } from '../engine/llm_engine.ts';
import { decodeParamsWrite } from '../serve/pd_flow.ts';
import { PdPair, type PdPairOptions } from './pd_pair.ts';
import { colocatedHashes } from './colocated_testkit.ts';

const env = new RealEnv(4);
const prompts: GenerateRequest[] = [5, 33, 47, 80].map((n, i) => ({
  promptTokenIds: Array.from({ length: n }, (_, k) => (i * 977 + k * 31) % 50000),
  sampling: { maxTokens: 5, temperature: i % 2 ? 0.9 : 0, seed: 3 + i, ignoreEos: true },
}));

const reference = (preset: PdPairOptions['preset']): Promise<string[]> => colocatedHashes(env, prompts, preset);

const base = (name: string, over: Partial<PdPairOptions> = {}): PdPairOptions => ({
  preset: 'dsv4-mini',
  modelSeed: 2,
  numBlocks: 128,
  decode: {},
  raceCheck: true,
  name,
  ...over,
});

test('WRITE mode: prefill pushes after its forward; decode output equals colocated, no race, no leak', async () => {
  const ref = await reference('dsv4-mini');
  const pair = await PdPair.create(base('write', { decode: { mode: 'write' } }), env);
  try {
    const got = await Promise.all(prompts.map((p) => pair.generateWrite(p)));
    got.forEach((r, i) => assert.equal(r.logitsHashes.join(','), ref[i], `request ${i}`));
    assert.ok(
      got.some((r) => r.numExternalTokens > 0),
      'KV came from prefill',
    );
    assert.equal((pair.decode.device.raceChecker as unknown as { races(): unknown[] }).races().length, 0);
    for (let k = 0; k < 200 && !(pair.prefill.core.isIdle() && pair.decode.core.isIdle()); k++) await env.sleep(5);
    assert.equal(pair.prefill.kv.getNumFreeBlocks(), 127, 'prefill freed its pages after write_done');
    assert.equal(pair.decode.kv.getNumFreeBlocks(), 127);
  } finally {
    await pair.close();
  }
});

test('READ failures (every READ fails): recompute policy recovers with the colocated output; fail policy returns KV_LOAD_FAILED', async () => {
  const ref = await reference('dsv4-mini');
  const pair = await PdPair.create(base('readfail', { decode: { faults: { readErrorRate: 1 } } }), env);
  try {
    const got = await Promise.all(prompts.map((p) => pair.generate(p)));
    got.forEach((r, i) => assert.equal(r.logitsHashes.join(','), ref[i], `request ${i} recomputed locally`));
    assert.ok(pair.decode.scheduler.stats.loadFailures >= 3, 'the loads did fail');
    for (let k = 0; k < 200 && !pair.prefill.core.isIdle(); k++) await env.sleep(5);
    assert.equal(pair.prefill.kv.getNumFreeBlocks(), 127, 'a failed READ still releases prefill');
  } finally {
    await pair.close();
  }
  const strict = await PdPair.create(
    base('readfail-strict', { decode: { faults: { readErrorRate: 1 } }, scheduler: { kvLoadFailurePolicy: 'fail' } }),
    env,
  );
  try {
    await assert.rejects(
      strict.generate(prompts[2] as GenerateRequest),
      (e: Error & { code?: string }) => e.code === 'KV_LOAD_FAILED',
    );
    for (let k = 0; k < 200 && !strict.decode.core.isIdle(); k++) await env.sleep(5);
    assert.equal(strict.decode.kv.getNumFreeBlocks(), 127, 'the failed request freed its pages (behind the fence)');
    assert.ok(
      await strict.decode.generate(prompts[0] as GenerateRequest).then((r) => r.tokenIds.length === 5),
      'decode keeps serving',
    );
  } finally {
    await strict.close();
  }
});

test('lease: prefill frees held pages and revokes the grant when decode never reads', async () => {
  const pair = await PdPair.create(base('lease', { prefill: { leaseMs: 150 } }), env);
  try {
    const r = await pair.prefill.generate({
      ...(prompts[3] as GenerateRequest),
      sampling: { maxTokens: 1 },
      kvTransferParams: { do_remote_decode: true, transfer_id: 'lease-1' },
    });
    assert.ok(r.kvTransferParams?.['grant'], 'a grant was issued');
    assert.ok(pair.prefill.kv.getNumFreeBlocks() < 127, 'pages held for the decode side');
    for (let k = 0; k < 200 && pair.prefill.kv.getNumFreeBlocks() < 127; k++) await env.sleep(10);
    assert.equal(pair.prefill.kv.getNumFreeBlocks(), 127, 'freed when the lease ended');
    assert.equal(pair.prefillConnector.scheduler.stats.leasesExpired, 1);
    // A READ with the dead grant is refused, not served; the lease ended (grant_expires_ms is past), which is
    // no fault of the client's: decode recomputes (kvLoadFailurePolicy 'recompute', lease.test.ts).
    const late = await pair.decode.generate({
      ...(prompts[3] as GenerateRequest),
      kvTransferParams: r.kvTransferParams,
    });
    assert.equal(late.tokenIds.length, 5, 'answered by a local recompute');
    assert.ok(pair.decode.scheduler.stats.loadFailures >= 1, 'the READ did fail');
    assert.ok(pair.prefillConnector.transfer.stats().grantsRefused >= 1);
    for (let k = 0; k < 200 && !pair.decode.core.isIdle(); k++) await env.sleep(5);
    assert.equal(pair.decode.kv.getNumFreeBlocks(), 127, 'the refused request freed its pages');
    assert.equal(
      (await pair.decode.generate(prompts[0] as GenerateRequest)).tokenIds.length,
      5,
      'decode keeps serving',
    );
  } finally {
    await pair.close();
  }
});

test('a decode request refused after prefill answered (too long for decode) releases prefill’s pages now, not at the lease', async () => {
  const pair = await PdPair.create(base('refused', { scheduler: { maxModelLen: 90 } }), env);
  try {
    const p = prompts[3] as GenerateRequest; // 80 prompt tokens
    const pre = await pair.prefill.generate({
      ...p,
      sampling: { maxTokens: 1 },
      kvTransferParams: { do_remote_decode: true, transfer_id: 'refused-1' },
    });
    assert.ok(pair.prefill.kv.getNumFreeBlocks() < 127, 'held for decode (60 s lease)');
    assert.throws(
      () =>
        pair.decode.submit(
          { ...p, sampling: { maxTokens: 20 }, kvTransferParams: pre.kvTransferParams },
          () => undefined,
        ),
      (e: Error & { code?: string }) => e.code === 'PROMPT_TOO_LONG',
    );
    for (let k = 0; k < 400 && pair.prefill.kv.getNumFreeBlocks() < 127; k++) await env.sleep(10);
    assert.equal(pair.prefill.kv.getNumFreeBlocks(), 127, 'released by decode, long before the lease');
    assert.equal(pair.prefillConnector.scheduler.stats.leasesExpired, 0);
    // A forged grant naming a live transfer cannot release it.
    const live = await pair.prefill.generate({
      ...p,
      sampling: { maxTokens: 1 },
      kvTransferParams: { do_remote_decode: true, transfer_id: 'refused-2' },
    });
    const forged = { ...live.kvTransferParams, grant: 'ab'.repeat(16) };
    assert.throws(() =>
      pair.decode.submit({ ...p, sampling: { maxTokens: 20 }, kvTransferParams: forged }, () => undefined),
    );
    for (let k = 0; k < 100 && pair.prefillConnector.transfer.stats().releasesRefused === 0; k++) await env.sleep(10);
    assert.equal(pair.prefillConnector.transfer.stats().releasesRefused, 1, 'the forged release was refused');
    assert.ok(pair.prefill.kv.getNumFreeBlocks() < 127, 'the live transfer keeps its pages');
  } finally {
    await pair.close();
  }
});

test('an answer that never reached its client: aborting the finished prefill request frees its held pages now (grant revoked), not at the lease', async () => {
  const pair = await PdPair.create(base('undelivered'), env);
  try {
    const r = await pair.prefill.generate({
      ...(prompts[3] as GenerateRequest),
      requestId: 'undelivered-req',
      sampling: { maxTokens: 1 },
      kvTransferParams: { do_remote_decode: true, transfer_id: 'undelivered-1' },
    });
    assert.ok(pair.prefill.kv.getNumFreeBlocks() < 127, 'held for decode (60 s lease)');
    pair.prefill.abort('undelivered-req'); // what the server does when the client left before the answer went out
    for (let k = 0; k < 200 && pair.prefill.kv.getNumFreeBlocks() < 127; k++) await env.sleep(10);
    assert.equal(pair.prefill.kv.getNumFreeBlocks(), 127, 'freed long before the lease');
    const stats = pair.prefillConnector.scheduler.stats;
    assert.deepEqual([stats.holdsEnded, stats.leasesExpired], [1, 0]);
    await assert.rejects(
      pair.decode.generate({ ...(prompts[3] as GenerateRequest), kvTransferParams: r.kvTransferParams }),
      (e: Error & { code?: string }) => e.code === 'GRANT_DENIED',
      'a READ with those params (had they leaked) is refused',
    );
    pair.prefill.abort('undelivered-req'); // again: nothing held any more, nothing happens
    assert.equal(pair.prefillConnector.scheduler.stats.holdsEnded, 1);
  } finally {
    await pair.close();
  }
});

test('WRITE: a decode that will never load (client gone before it told prefill where to write) releases prefill’s pages now; a lease-ended save is never pushed', async () => {
  const pair = await PdPair.create(
    base('write-release', { decode: { mode: 'write' }, prefill: { leaseMs: 400 } }),
    env,
  );
  try {
    const p = prompts[3] as GenerateRequest;
    const hold = async (transferId: string): Promise<void> => {
      await pair.prefill.generate({
        ...p,
        sampling: { maxTokens: 1 },
        kvTransferParams: { do_remote_decode: true, transfer_id: transferId },
      });
      assert.ok(pair.prefill.kv.getNumFreeBlocks() < 127, 'held until decode says where to write');
      for (let k = 0; k < 100 && pair.prefillConnector.worker.saves.numPending === 0; k++) await env.sleep(2);
      assert.equal(pair.prefillConnector.worker.saves.numPending, 1, 'a save waits for its destination');
    };
    await hold('w-release');
    const addr = pair.prefillConnector.transfer.address();
    const params = {
      ...decodeParamsWrite(
        {
          engineId: pair.prefillConnector.transfer.engineId,
          sideChannelHost: addr.host,
          sideChannelPort: addr.port,
          transferMode: 'write',
        },
        'w-release',
      ),
    };
    assert.equal(pair.decode.releaseUnused(params), true);
    for (let k = 0; k < 300 && pair.prefill.kv.getNumFreeBlocks() < 127; k++) await env.sleep(5);
    assert.equal(pair.prefill.kv.getNumFreeBlocks(), 127, 'released by decode, before the lease');
    assert.equal(pair.prefillConnector.scheduler.stats.leasesExpired, 0);
    assert.equal(pair.prefillConnector.worker.saves.numPending, 0, 'the save was dropped with the release');
    // No release at all: the lease frees the pages, and the save goes with them (a late destination
    // must never be pushed from pages another request may own by then).
    await hold('w-lease');
    for (let k = 0; k < 300 && pair.prefill.kv.getNumFreeBlocks() < 127; k++) await env.sleep(10);
    assert.equal(pair.prefillConnector.scheduler.stats.leasesExpired, 1);
    for (let k = 0; k < 100 && pair.prefillConnector.worker.saves.numPending > 0; k++) await env.sleep(5);
    assert.equal(pair.prefillConnector.worker.saves.numPending, 0, 'the lease-ended save was dropped');
  } finally {
    await pair.close();
  }
});
