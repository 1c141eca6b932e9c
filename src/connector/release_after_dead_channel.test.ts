/**
 * Proves that a READ failing because the side channel to its producer is gone (PEER_UNAVAILABLE) has its
 * release sent over a new handshake, for synchronous and async READs alike, so the producer frees the pages
 * at once instead of at its lease's end. An async READ's release went first, down the dead channel, and
 * failed: collectAsync released before it reported the failure, and reporting is what forgets the channel
 * (found in session 20 when async READs became the serving default: test/e2e/faults.test.ts's `ss -K` case).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import type { EngineMetadata } from '../transfer/core/types.ts';
import type { RecvReqMeta } from '../worker/connector_metadata.ts';
import { PeerDirectory } from './peer_directory.ts';
import { ReadConsumer } from './read_consumer.ts';
import { flush, HOST, PORT, readContext } from './read_consumer_testkit.ts';

const ENGINE = 'prefill-1';

/** One READ that fails because its side channel died; the releases the producer got and those lost. */
async function failOnDeadChannel(async: boolean): Promise<{ delivered: number; lost: number; sent: number }> {
  const env = new SimEnv(1);
  // The side channel of the last handshake; the test kills it (a socket destroyed under both sides).
  let channelAlive = false;
  const peers = new PeerDirectory(() => {
    channelAlive = true;
    return Promise.resolve({ engineId: ENGINE } as unknown as EngineMetadata);
  }, env);
  let delivered = 0;
  let lost = 0;
  const dead = (): HandoffError => new HandoffError('PEER_UNAVAILABLE', 'side channel closed');
  const { ctx } = readContext(env, peers, {
    transfer: {
      wait: () => Promise.reject(dead()),
      notify: () => (channelAlive ? (delivered++, Promise.resolve()) : (lost++, Promise.reject(dead()))),
    },
  });
  peers.statusFor(HOST, PORT, ENGINE);
  await flush();
  assert.equal(channelAlive, true, 'handshaken before the READ');
  const reads = new ReadConsumer(ctx);
  const r: RecvReqMeta = {
    requestId: 'req-1',
    transferId: 'x-1',
    localBlockIds: [[1]],
    remoteBlockIds: [[1]],
    tokenRuns: [[0, 16]],
    remoteBlockSize: 16,
    remoteEngineId: ENGINE,
    remoteHost: HOST,
    remotePort: PORT,
    grant: 'ab'.repeat(16),
    async,
  };
  ctx.workRequestsFor = () => [{ ranges: [], footprint: [] }];
  channelAlive = false; // the channel dies while the READ is posted
  await reads.startLoadKv([r], 1);
  let code: string | undefined;
  if (async) {
    await flush();
    code = reads.collectAsync(1).loads.loadErrors['req-1']?.code;
  } else code = (await reads.awaitReadsIssuedThisStep(1)).loadErrors['req-1']?.code;
  assert.equal(code, 'PEER_UNAVAILABLE');
  await flush();
  return { delivered, lost, sent: reads.stats.releasesSent };
}

for (const async of [false, true])
  test(`${async ? 'async' : 'synchronous'} READ failed on a dead side channel: its release goes over a new handshake`, async () => {
    const { delivered, lost, sent } = await failOnDeadChannel(async);
    assert.deepEqual({ delivered, lost, sent }, { delivered: 1, lost: 0, sent: 1 });
  });
