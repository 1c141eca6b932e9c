/**
 * Proves that a request naming another engine id at a ready producer's address (a stale request after a
 * restart, or any client's made-up remote_engine_id) does not take the side channel away from the requests
 * of the engine that answers there. Its refresh handshake replaced the ready entry with `connecting`, so the
 * READs admitted earlier in the same step for the live engine failed at post (readyEngine: "no side channel
 * yet", PEER_UNAVAILABLE): recomputed or failed by kvLoadFailurePolicy, one bogus request per step sufficing.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import type { EngineMetadata } from '../transfer/core/types.ts';
import { PeerDirectory } from './peer_directory.ts';
import { ReadConsumer } from './read_consumer.ts';
import { flush, HOST, PORT, readContext } from './read_consumer_testkit.ts';

test('a refresh for another engine id leaves the ready engine usable until it answers', async () => {
  const answers: Array<(m: EngineMetadata) => void> = [];
  const peers = new PeerDirectory(() => new Promise<EngineMetadata>((r) => answers.push(r)), new SimEnv(1));
  const answer = (engineId: string): void => answers.shift()?.({ engineId } as unknown as EngineMetadata);
  assert.equal(peers.statusFor(HOST, PORT, 'prefill-a').state, 'connecting');
  answer('prefill-a');
  await flush();
  assert.deepEqual(peers.statusFor(HOST, PORT, 'prefill-a'), { state: 'ready', engineId: 'prefill-a' });
  // A request of this step was admitted for prefill-a; a later one names an engine id that is not there.
  assert.equal(peers.statusFor(HOST, PORT, 'prefill-zzz').state, 'connecting', 'that one waits for the refresh');
  assert.equal(peers.readyEngine(HOST, PORT, 'prefill-a'), 'prefill-a', 'the admitted READ still posts');
  assert.deepEqual(peers.statusFor(HOST, PORT, 'prefill-a'), { state: 'ready', engineId: 'prefill-a' });
  // The release of a request naming the other id waits for the refresh's answer.
  const released = peers.resolve(HOST, PORT, 'prefill-zzz').then(
    () => 'resolved',
    (e: Error) => e.message,
  );
  answer('prefill-a');
  assert.match(await released, /is prefill-a, not prefill-zzz/);
  assert.deepEqual(peers.peek(HOST, PORT), { state: 'ready', engineId: 'prefill-a' });
  assert.deepEqual(peers.statusFor(HOST, PORT, 'prefill-zzz'), { state: 'ready', engineId: 'prefill-a' }, 'once');
  assert.equal(answers.length, 0, 'no further handshake');
});

test('a refresh answered by a new engine (the producer restarted) replaces the entry', async () => {
  const answers: Array<(m: EngineMetadata) => void> = [];
  const peers = new PeerDirectory(() => new Promise<EngineMetadata>((r) => answers.push(r)), new SimEnv(1));
  const answer = (engineId: string): void => answers.shift()?.({ engineId } as unknown as EngineMetadata);
  peers.statusFor(HOST, PORT, 'prefill-old');
  answer('prefill-old');
  await flush();
  assert.equal(peers.statusFor(HOST, PORT, 'prefill-new').state, 'connecting');
  answer('prefill-new');
  await flush();
  assert.deepEqual(peers.statusFor(HOST, PORT, 'prefill-new'), { state: 'ready', engineId: 'prefill-new' });
  assert.throws(() => peers.readyEngine(HOST, PORT, 'prefill-old'), /prefill-old is gone/);
});

test('the READ admitted for the live engine lands although a later request of its step refreshes the address', async () => {
  const env = new SimEnv(1);
  const answers: Array<(m: EngineMetadata) => void> = [];
  const peers = new PeerDirectory(() => new Promise<EngineMetadata>((r) => answers.push(r)), env);
  const { ctx, posted } = readContext(env, peers);
  peers.statusFor(HOST, PORT, 'prefill-a');
  answers.shift()?.({ engineId: 'prefill-a' } as unknown as EngineMetadata);
  await flush();
  // Scheduler side, one step: the live request is admitted, then a request naming a made-up engine id.
  assert.equal(peers.statusFor(HOST, PORT, 'prefill-a').state, 'ready');
  peers.statusFor(HOST, PORT, 'prefill-made-up');
  const reads = new ReadConsumer(ctx);
  await reads.startLoadKv(
    [
      {
        requestId: 'live',
        transferId: 'x-live',
        localBlockIds: [[1]],
        remoteBlockIds: [[1]],
        tokenRuns: [[0, 16]],
        remoteBlockSize: 16,
        remoteEngineId: 'prefill-a',
        remoteHost: HOST,
        remotePort: PORT,
        grant: 'ab'.repeat(16),
      },
    ],
    1,
  );
  const result = await reads.awaitReadsIssuedThisStep(1);
  assert.deepEqual(result.loadErrors, {});
  assert.deepEqual(posted, ['x-live']);
});
