/**
 * PeerDirectory: handshakes start in the background and never make a caller wait (connecting → ready |
 * failed), failed peers are retried only after a backoff, a cached answer naming another engine is
 * re-asked once per expected engine id, forgotten peers handshake again, the allow-list refuses before
 * any contact, and the number of remembered peers is bounded.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv, SimEnv } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import type { EngineMetadata, PeerAddress } from '../transfer/core/types.ts';
import { makeNode } from '../transfer/testing/conformance_support.ts';
import { FAILED_RETRY_MS, PEERS_MAX, PeerDirectory, parsePeerAllowList, peerAllowed } from './peer_directory.ts';

/** A handshake whose outcome the test decides. */
function fakeHandshakes() {
  const pending: Array<{ peer: PeerAddress; ok: (engineId: string) => void; fail: (e: HandoffError) => void }> = [];
  const handshake = (peer: PeerAddress): Promise<EngineMetadata> =>
    new Promise((resolve, reject) =>
      pending.push({ peer, ok: (engineId) => resolve({ engineId } as EngineMetadata), fail: reject }),
    );
  return { pending, handshake };
}
const tick = () => new Promise((r) => setImmediate(r));

test('connecting → ready without waiting; onChange fires when it settles; the worker view never starts a handshake', async () => {
  const env = new SimEnv(1);
  const h = fakeHandshakes();
  let changes = 0;
  const d = new PeerDirectory(h.handshake, env, ['loopback'], () => changes++);
  assert.equal(d.peek('127.0.0.1', 9), undefined);
  assert.equal(h.pending.length, 0, 'peek does not handshake');
  assert.deepEqual(d.statusFor('127.0.0.1', 9, 'p1'), { state: 'connecting' });
  assert.deepEqual(d.statusFor('127.0.0.1', 9, 'p1'), { state: 'connecting' });
  assert.equal(h.pending.length, 1, 'one handshake per peer');
  h.pending[0]?.ok('p1');
  await tick();
  assert.equal(changes, 1);
  assert.deepEqual(d.statusFor('127.0.0.1', 9, 'p1'), { state: 'ready', engineId: 'p1' });
  assert.equal(await d.resolve('127.0.0.1', 9, 'p1'), 'p1');
});

test('a failed handshake is reported (not retried) until the backoff passes, then retried', async () => {
  const env = new SimEnv(1);
  const h = fakeHandshakes();
  const d = new PeerDirectory(h.handshake, env);
  d.statusFor('127.0.0.1', 9, 'p1');
  h.pending[0]?.fail(new HandoffError('PEER_UNAVAILABLE', 'handshake timed out'));
  await tick();
  assert.equal(d.statusFor('127.0.0.1', 9, 'p1').state, 'failed');
  await assert.rejects(d.resolve('127.0.0.1', 9, 'p1'), /timed out/);
  assert.equal(h.pending.length, 1);
  env.advanceTo(FAILED_RETRY_MS);
  assert.equal(d.statusFor('127.0.0.1', 9, 'p1').state, 'connecting');
  assert.equal(h.pending.length, 2, 'retried after the backoff');
});

test('a cached answer naming another engine is asked again once per expected id (a restarted peer); forget() handshakes anew', async () => {
  const env = new SimEnv(1);
  const h = fakeHandshakes();
  const d = new PeerDirectory(h.handshake, env);
  d.statusFor('127.0.0.1', 9, 'old');
  h.pending[0]?.ok('old');
  await tick();
  assert.equal(d.statusFor('127.0.0.1', 9, 'new').state, 'connecting', 'mismatch: ask again');
  h.pending[1]?.ok('new');
  await tick();
  assert.deepEqual(d.statusFor('127.0.0.1', 9, 'new'), { state: 'ready', engineId: 'new' });
  assert.deepEqual(d.statusFor('127.0.0.1', 9, 'stale'), { state: 'connecting' }, 'another expected id asks once');
  h.pending[2]?.ok('new');
  await tick();
  assert.deepEqual(
    d.statusFor('127.0.0.1', 9, 'stale'),
    { state: 'ready', engineId: 'new' },
    'not again for the same stale id',
  );
  assert.equal(h.pending.length, 3);
  await assert.rejects(
    d.resolve('127.0.0.1', 9, 'stale'),
    (e: unknown) => e instanceof HandoffError && e.code === 'BAD_TRANSFER_PARAMS',
  );
  d.forget('127.0.0.1', 9);
  assert.equal(d.peek('127.0.0.1', 9), undefined);
  d.statusFor('127.0.0.1', 9, 'new');
  assert.equal(h.pending.length, 4);
});

test('allow-list: refused before any contact; patterns host:port, host:*, loopback, *; bad lists are BAD_CONFIG', () => {
  const h = fakeHandshakes();
  const d = new PeerDirectory(h.handshake, new SimEnv(1), parsePeerAllowList('10.0.0.5:7000, prefill-a:*'));
  assert.throws(
    () => d.statusFor('127.0.0.1', 9, 'p'),
    (e: unknown) => e instanceof HandoffError && e.code === 'PEER_NOT_ALLOWED' && e.httpStatus === 403,
  );
  assert.throws(() => d.checkAllowed('10.0.0.5', 7001), /not an allowed KV peer/);
  assert.doesNotThrow(() => d.checkAllowed('10.0.0.5', 7000));
  assert.doesNotThrow(() => d.checkAllowed('prefill-a', 1));
  assert.equal(h.pending.length, 0);
  assert.ok(
    peerAllowed(['loopback'], '127.3.4.5', 1) &&
      peerAllowed(['loopback'], '::1', 1) &&
      peerAllowed(['loopback'], 'inproc://x', 0),
  );
  assert.ok(!peerAllowed(['loopback'], '10.0.0.1', 1) && !peerAllowed(['loopback'], '128.0.0.1', 1));
  assert.ok(peerAllowed(['*'], '10.0.0.1', 1));
  for (const bad of ['', ' , ', 'host', 'host:0', 'host:70000', ':80', 'h:x'])
    assert.throws(() => parsePeerAllowList(bad), /--kv-peers/);
});

test(`at most PEERS_MAX (${PEERS_MAX}) peers are remembered; settled ones are evicted first`, async () => {
  const h = fakeHandshakes();
  const d = new PeerDirectory(h.handshake, new SimEnv(1), ['*']);
  for (let i = 0; i < PEERS_MAX; i++) d.statusFor(`h${i}`, 1, 'e');
  for (const p of h.pending) p.ok('e');
  await tick();
  d.statusFor('one-more', 1, 'e');
  assert.equal(d.size, PEERS_MAX);
  assert.equal(d.peek('h0', 1), undefined, 'the oldest settled entry went');
});

test(`a flood of addresses that answer nothing does not push a live producer out (failed entries go first)`, async () => {
  const h = fakeHandshakes();
  const d = new PeerDirectory(h.handshake, new SimEnv(1), ['loopback']);
  d.statusFor('127.0.0.1', 8000, 'producer');
  h.pending[0]?.ok('producer');
  await tick();
  // A client names PEERS_MAX + 100 loopback ports where nothing listens: every handshake fails.
  for (let i = 0; i < PEERS_MAX + 100; i++) {
    d.statusFor('127.0.0.2', 1 + i, 'bogus');
    h.pending[h.pending.length - 1]?.fail(new HandoffError('PEER_UNAVAILABLE', 'connection refused'));
    await tick();
  }
  assert.equal(d.size, PEERS_MAX);
  assert.deepEqual(d.peek('127.0.0.1', 8000), { state: 'ready', engineId: 'producer' }, 'the producer stayed');
  assert.equal(d.peek('127.0.0.2', 1), undefined, 'the oldest failed entry went');
});

test('an unknown engine whose address failed: "does not answer" (400) when it timed out, 409 when refused as incompatible', async () => {
  const env = new SimEnv(1);
  const h = fakeHandshakes();
  const d = new PeerDirectory(h.handshake, env);
  d.statusFor('127.0.0.1', 9, 'p1');
  d.statusFor('127.0.0.1', 10, 'p2');
  h.pending[0]?.fail(new HandoffError('PEER_UNAVAILABLE', 'handshake timed out'));
  h.pending[1]?.fail(new HandoffError('PEER_INCOMPATIBLE', 'p2 refused the handshake: blockSizes [32] != [16]'));
  await tick();
  const message = (port: number, id: string, code: string): string => {
    try {
      d.readyEngine('127.0.0.1', port, id);
    } catch (e) {
      // catch-ok: the test reads the error
      assert.ok(e instanceof HandoffError && e.code === code, String(e));
      return e.message;
    }
    return '';
  };
  assert.match(message(9, 'p1', 'BAD_TRANSFER_PARAMS'), /127\.0\.0\.1:9 does not answer \(handshake timed out\)/);
  // It answered and refused to pair: the deployment's mismatch, not the client's params.
  assert.match(message(10, 'p2', 'PEER_INCOMPATIBLE'), /127\.0\.0\.1:10 refused the handshake \(.*blockSizes/);
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test('tcp: a producer restarted on its address under a new engine id is handshaken again (the refresh asks the peer, not a side channel still open to the old one)', async () => {
  const C = await makeNode('tcp', null, { engineId: 'consumer' });
  const P1 = await makeNode('tcp', 1, { engineId: 'prefill-old' });
  const { host, port } = P1.engine.address();
  const d = new PeerDirectory((peer) => C.engine.handshake(peer), new RealEnv(1), ['loopback']);
  let P2: Awaited<ReturnType<typeof makeNode>> | null = null;
  try {
    assert.equal(await d.resolve(host, port, 'prefill-old'), 'prefill-old');
    // The old producer goes away; in the same turn a request naming the restarted producer arrives.
    const closing = P1.engine.close();
    assert.equal(d.statusFor(host, port, 'prefill-new').state, 'connecting', 'mismatch: the directory asks again');
    await closing;
    await sleep(200); // the consumer has now seen the old side channel close
    P2 = await makeNode('tcp', 2, { engineId: 'prefill-new', port });
    assert.equal(P2.engine.address().port, port);
    // Long after the restart (and past the failed-retry backoff), requests for the new producer:
    await sleep(1500);
    for (let i = 0; i < 5; i++) d.statusFor(host, port, 'prefill-new');
    await sleep(200);
    const got = await d.resolve(host, port, 'prefill-new').then(
      (id) => id,
      (e: unknown) => `rejected: ${(e as { code?: string }).code} ${(e as Error).message}`,
    );
    assert.equal(got, 'prefill-new', 'the live producer at that address is prefill-new');
  } finally {
    await Promise.all([C.engine.close(), P1.engine.close(), P2?.engine.close()]);
  }
});
