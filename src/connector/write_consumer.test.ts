/**
 * Proves the WRITE consumer's fence against a late WRITE: a load past its deadline is reported failed,
 * and an aborted load's pages released, only once drainGrant settled after the revoke (until then a
 * WRITE under way may still be landing in the pages: recomputing into them or handing them to another
 * request would put the producer's late bytes over new KV). The transfer engine here is a recorder whose
 * drains settle when the test says.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import { mutationsFor } from '../util/mutants.ts';
import type { Device } from '../device/types.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import type { TransferEngine } from '../transfer/core/types.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from './config.ts';
import type { PeerDirectory } from './peer_directory.ts';
import { WorkerContext } from './worker_context.ts';
import { WriteConsumer } from './write_consumer.ts';

const TOKEN = 'ab'.repeat(16);

function rig() {
  const env = new SimEnv(1);
  const kv = makeKVCacheConfig(presetKVGroups('llama-mini', 16), 64);
  const calls: string[] = [];
  const drains = new Map<string, () => void>();
  const transfer = {
    peerMetadata: () => ({}), // the producer is still connected
    issueGrant: (g: { transferId: string }) => (calls.push(`grant ${g.transferId}`), { token: TOKEN }),
    revokeGrant: (t: string) => (calls.push(`revoke ${t}`), true),
    drainGrant: (t: string) => {
      calls.push(`drain ${t}`);
      return new Promise<void>((resolve) => drains.set(t, resolve));
    },
    notify: () => Promise.resolve(),
  };
  const peers = { readyEngine: () => 'prefill-0' };
  const unused = {} as unknown;
  const ctx = new WorkerContext(
    DEFAULT_ONE_SIDED_CONFIG,
    kv,
    transfer as unknown as TransferEngine,
    unused as Device,
    kv.groups.map((g) => g.groupId),
    env,
    peers as unknown as PeerDirectory,
    mutationsFor(undefined),
    undefined,
  );
  let woken = 0;
  const recvs = new WriteConsumer(ctx, () => woken++);
  const notify = (requestId: string, transferId: string): void =>
    recvs.notifyRemoteBlocks({
      requestId,
      transferId,
      localBlockIds: [[3, 4]],
      skipBlocks: 0,
      endToken: 32,
      remoteEngineId: 'prefill-0',
      remoteHost: '127.0.0.1',
      remotePort: 1,
    });
  const settle = async (t: string): Promise<void> => {
    drains.get(t)?.();
    await new Promise((r) => setImmediate(r));
  };
  return { env, calls, recvs, notify, settle, woken: () => woken };
}

test('a load past its deadline fails only once the drain after its revoke settled', async () => {
  const { env, calls, recvs, notify, settle, woken } = rig();
  notify('r1', 't1');
  env.advanceTo(DEFAULT_ONE_SIDED_CONFIG.transferTimeoutMs + 1);
  const first = recvs.collect();
  assert.deepEqual(first.loads.failedLoadReqIds, [], 'not while a WRITE may still be landing');
  assert.deepEqual(calls, ['grant t1', 'revoke t1', 'drain t1'], 'revoked, then drained');
  assert.deepEqual(recvs.collect().loads.failedLoadReqIds, [], 'still not: the drain has not settled');
  await settle('t1');
  assert.equal(woken(), 1, 'the engine is woken to report it');
  const after = recvs.collect();
  assert.deepEqual(after.loads.failedLoadReqIds, ['r1']);
  assert.deepEqual(after.loads.invalidBlockIds, [3, 4]);
  assert.equal(after.loads.loadErrors['r1']?.code, 'TIMEOUT');
  assert.deepEqual(recvs.collect().loads.failedLoadReqIds, [], 'reported once');
  assert.equal(recvs.size, 0);
});

test('an aborted load is released once its drain settled, before the deadline and without write_done', async () => {
  const { calls, recvs, notify, settle } = rig();
  notify('r1', 't1');
  recvs.aborted('t1', 'r1');
  assert.deepEqual(calls, ['grant t1', 'revoke t1', 'drain t1']);
  assert.deepEqual(recvs.collect().releasedAborted, [], 'not while a WRITE may still be landing');
  await settle('t1');
  assert.deepEqual(recvs.collect().releasedAborted, ['r1']);
  recvs.writeDone('t1', TOKEN); // a write_done after the release changes nothing
  assert.deepEqual(recvs.collect().releasedAborted, []);
});

test('write_done before the drain settles releases the aborted load (the WRITE landed whole); the drain then changes nothing', async () => {
  const { recvs, notify, settle } = rig();
  notify('r1', 't1');
  recvs.aborted('t1', 'r1');
  recvs.writeDone('t1', TOKEN);
  assert.deepEqual(recvs.collect().releasedAborted, ['r1']);
  await settle('t1');
  assert.deepEqual(recvs.collect().releasedAborted, []);
  assert.equal(recvs.size, 0);
});

test('a WRITE done before its deadline is finished without a drain', () => {
  const { calls, recvs, notify } = rig();
  notify('r1', 't1');
  recvs.writeDone('t1', TOKEN);
  const c = recvs.collect();
  assert.deepEqual(c.finishedRecving, ['r1']);
  assert.deepEqual(c.loads.failedLoadReqIds, []);
  assert.deepEqual(calls, ['grant t1', 'revoke t1']);
});

test('a request aborted while its timed-out load drains is released once drained, not reported as a failed load', async () => {
  const { env, calls, recvs, notify, settle } = rig();
  notify('r1', 't1');
  env.advanceTo(DEFAULT_ONE_SIDED_CONFIG.transferTimeoutMs + 1);
  assert.deepEqual(recvs.collect().loads.failedLoadReqIds, []);
  recvs.aborted('t1', 'r1'); // the client leaves before the drain settled
  assert.deepEqual(calls, ['grant t1', 'revoke t1', 'drain t1', 'revoke t1'], 'the pending drain serves');
  await settle('t1');
  const c = recvs.collect();
  assert.deepEqual(c.releasedAborted, ['r1'], 'its pages go back (the scheduler holds them for this)');
  assert.deepEqual(c.loads.failedLoadReqIds, []);
  assert.equal(recvs.size, 0);
});
