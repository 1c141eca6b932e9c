/**
 * Proves that a READ failing because its producer was replaced at the same address (a restart: the
 * params name the old engine id) does not drop the directory's side channel to the engine now answering
 * there. It did (ReadConsumer.report forgot host:port on every PEER_UNAVAILABLE): after a producer restart
 * each stale queued request made decode handshake again with the healthy new engine (its requests parked
 * `connecting` meanwhile), so the handshakes grew with the number of stale requests instead of one refresh.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import type { EngineMetadata } from '../transfer/core/types.ts';
import type { RecvReqMeta } from '../worker/connector_metadata.ts';
import { PeerDirectory } from './peer_directory.ts';
import { ReadConsumer } from './read_consumer.ts';
import { flush, HOST, PORT, readContext } from './read_consumer_testkit.ts';

test('stale READs after a producer restart leave the new engine’s side channel alone (one refresh, not one per request)', async () => {
  const env = new SimEnv(1);
  let engineId = 'prefill-old';
  let handshakes = 0;
  const peers = new PeerDirectory(() => {
    handshakes++;
    return Promise.resolve({ engineId } as unknown as EngineMetadata);
  }, env);
  const { ctx } = readContext(env, peers);
  // The old prefill served this decode, then restarts on the same address as a new engine.
  peers.statusFor(HOST, PORT, 'prefill-old');
  await flush();
  engineId = 'prefill-new';
  peers.statusFor(HOST, PORT, 'prefill-new');
  await flush();
  assert.deepEqual(peers.peek(HOST, PORT), { state: 'ready', engineId: 'prefill-new' });
  const before = handshakes;
  const reads = new ReadConsumer(ctx);
  for (let step = 1; step <= 4; step++) {
    const r: RecvReqMeta = {
      requestId: `stale-${step}`,
      transferId: `x-${step}`,
      localBlockIds: [[1]],
      remoteBlockIds: [[1]],
      tokenRuns: [[0, 16]],
      remoteBlockSize: 16,
      remoteEngineId: 'prefill-old',
      remoteHost: HOST,
      remotePort: PORT,
      grant: 'ab'.repeat(16),
    };
    await reads.startLoadKv([r], step);
    const result = await reads.awaitReadsIssuedThisStep(step);
    assert.equal(result.loadErrors[`stale-${step}`]?.code, 'PEER_UNAVAILABLE');
    await flush();
    assert.deepEqual(peers.peek(HOST, PORT), { state: 'ready', engineId: 'prefill-new' }, `after stale READ ${step}`);
  }
  // At most one refresh for the old engine id (PeerDirectory.statusFor's refreshedFor), whatever their number.
  assert.ok(handshakes - before <= 1, `${handshakes - before} handshakes for 4 stale requests`);
});
