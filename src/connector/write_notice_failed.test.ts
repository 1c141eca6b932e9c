/**
 * Decode in WRITE mode: the `remote_blocks` notice that tells prefill where to write fails (the side channel
 * dropped: prefill hung, died, or restarted). Prefill may never learn where to write, so no push will come;
 * before, decode forgot the side channel but let the load wait out its whole transfer deadline (30 s by
 * default) before recomputing. Proves: the load is reported failed at the next collect after the failed
 * notice (the grant revoked and drained first), and the engine is woken to collect it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { mutationsFor } from '../util/mutants.ts';
import type { Device } from '../device/types.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import type { TransferEngine } from '../transfer/core/types.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from './config.ts';
import type { PeerDirectory } from './peer_directory.ts';
import { WorkerContext } from './worker_context.ts';
import { WriteConsumer } from './write_consumer.ts';

const tick = () => new Promise((r) => setImmediate(r));

test('WRITE consumer: a remote_blocks notice that failed fails the load at once, not at the deadline', async () => {
  const env = new SimEnv(1);
  const kv = makeKVCacheConfig(presetKVGroups('llama-mini', 16), 64);
  const calls: string[] = [];
  const transfer = {
    peerMetadata: () => ({}), // the producer is still connected
    issueGrant: () => ({ token: 'tok' }),
    revokeGrant: (t: string) => (calls.push(`revoke ${t}`), true),
    drainGrant: (t: string) => (calls.push(`drain ${t}`), Promise.resolve()),
    notify: () => Promise.reject(new HandoffError('PEER_UNAVAILABLE', 'side channel closed')),
  };
  const peers = { readyEngine: () => 'prefill-0', forget: () => calls.push('forget') };
  const ctx = new WorkerContext(
    DEFAULT_ONE_SIDED_CONFIG,
    kv,
    transfer as unknown as TransferEngine,
    {} as Device,
    kv.groups.map((g) => g.groupId),
    env,
    peers as unknown as PeerDirectory,
    mutationsFor(undefined),
    undefined,
  );
  let woken = 0;
  const recvs = new WriteConsumer(ctx, () => woken++);
  recvs.notifyRemoteBlocks({
    requestId: 'D',
    transferId: 'T',
    localBlockIds: [[3, 4]],
    skipBlocks: 0,
    endToken: 32,
    remoteEngineId: 'prefill-0',
    remoteHost: '127.0.0.1',
    remotePort: 1,
  });
  await tick();
  assert.ok(calls.includes('forget'), 'the dropped side channel is forgotten');
  assert.ok(woken > 0, 'the engine is woken to report the failed load');
  env.advanceTo(env.nowMs() + 1); // a millisecond later, the deadline (30 s) far away
  assert.deepEqual(recvs.collect().loads.failedLoadReqIds, [], 'reported only once the grant drained');
  await tick();
  const { loads } = recvs.collect();
  assert.deepEqual(loads.failedLoadReqIds, ['D'], 'the load fails now: nobody will write it');
  assert.deepEqual(calls.slice(-2), ['revoke T', 'drain T'], 'its grant revoked and drained before the report');
});
