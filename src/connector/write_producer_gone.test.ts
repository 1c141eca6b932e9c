/**
 * Decode in WRITE mode, real tcp engines: prefill acknowledged the `remote_blocks` notice (it knows where to
 * write), then its process died or restarted before its push landed (it answers the proxy as soon as its
 * request finishes; the push follows once the save and the destination meet, which can be seconds later on
 * a busy decode). The side channel to it closes: its engine is gone here (peerMetadata null), its data
 * connections are dropped with it (a push under way fails), and no write_done can reach us. Before, the
 * load waited out its whole transfer deadline (30 s by default) before recomputing: the client's request
 * stalled 30 s for a producer known to be gone (and failed then with a misleading "did not write within
 * 30000 ms" under kvLoadFailurePolicy 'fail'). Proves: the load is reported failed at the first collect
 * after the producer is gone, its grant revoked and drained first, well before the deadline.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv, SimEnv } from '../util/env.ts';
import { mutationsFor } from '../util/mutants.ts';
import type { Device } from '../device/types.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import { makeNode } from '../transfer/testing/conformance_support.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from './config.ts';
import type { PeerDirectory } from './peer_directory.ts';
import { WorkerContext } from './worker_context.ts';
import { WriteConsumer } from './write_consumer.ts';

const real = new RealEnv(5);

async function eventually(what: string, cond: () => boolean, boundMs = 10_000): Promise<void> {
  const deadline = real.nowMs() + boundMs;
  while (!cond()) {
    if (real.nowMs() > deadline) assert.fail(`${what}: still not true after ${boundMs} ms`);
    await real.sleep(5);
  }
}

test('WRITE consumer: a producer that is gone after taking the destination fails the load now, not at the deadline', async () => {
  const D = await makeNode('tcp', null, { engineId: 'gone-decode' });
  const P = await makeNode('tcp', 1, { engineId: 'gone-prefill' });
  let pClosed = false;
  try {
    const { host, port } = P.engine.address();
    await D.engine.handshake({ host, port });
    const told: string[] = [];
    P.engine.onNotification((_from, n) => void told.push(n.type));
    const env = new SimEnv(1);
    const kv = makeKVCacheConfig(presetKVGroups('llama-mini', 16), 16);
    const peers = { readyEngine: () => P.engine.engineId, forget: () => {} };
    const ctx = new WorkerContext(
      DEFAULT_ONE_SIDED_CONFIG,
      kv,
      D.engine,
      {} as Device,
      kv.groups.map((g) => g.groupId),
      env,
      peers as unknown as PeerDirectory,
      mutationsFor(undefined),
      undefined,
    );
    const recvs = new WriteConsumer(ctx);
    recvs.notifyRemoteBlocks({
      requestId: 'D',
      transferId: 'T',
      localBlockIds: [[3, 4]],
      skipBlocks: 0,
      endToken: 32,
      remoteEngineId: P.engine.engineId,
      remoteHost: host,
      remotePort: port,
    });
    await eventually('prefill was told where to write', () => told.includes('remote_blocks'));
    // Prefill dies (or restarts) before its push: its side channel closes, decode forgets the engine.
    await P.engine.close();
    pClosed = true;
    await eventually('the producer is gone on decode', () => D.engine.peerMetadata(P.engine.engineId) === null);
    env.advanceTo(env.nowMs() + 1000); // a second later: the deadline (30 s) is far away
    let failed: string[] = [];
    for (let k = 0; k < 200 && failed.length === 0; k++) {
      failed = recvs.collect().loads.failedLoadReqIds;
      if (failed.length === 0) await real.sleep(5);
    }
    assert.deepEqual(failed, ['D'], 'the load fails now: the gone producer will never write it');
    assert.equal(D.engine.revokeGrant('T'), false, 'its grant was revoked before the report');
  } finally {
    await Promise.all([D.engine.close(), pClosed ? Promise.resolve() : P.engine.close()]);
  }
});
