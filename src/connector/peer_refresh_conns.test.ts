/**
 * A peer-directory refresh (a request whose kv_transfer_params name another engine id at
 * a known producer address) dials the producer again with `fresh: true`. When the same producer answers,
 * the side channel it replaces must be closed: before the fix every refresh left one more side channel
 * open on both sides, so requests with stale or made-up remote_engine_ids piled them up until the
 * producer's listener refused every new side channel (SIDE_CONNECTIONS_MAX), and another decode could
 * no longer handshake with it at all (a client's requests hurting every other decode of the cluster).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { RealEnv } from '../util/env.ts';
import { PeerDirectory } from './peer_directory.ts';
import { makeNode } from '../transfer/testing/conformance_support.ts';

const env = new RealEnv(7);
const openFds = (): number => fs.readdirSync('/proc/self/fd').length;

/** Poll until `cond` holds; a liveness bound, not a speed check. */
async function eventually(what: string, cond: () => boolean, boundMs = 10_000): Promise<void> {
  const deadline = env.nowMs() + boundMs;
  while (!cond()) {
    if (env.nowMs() > deadline) assert.fail(`${what}: still not true after ${boundMs} ms`);
    await env.sleep(5);
  }
}

test('refreshes answered by the same producer leave no side channel behind; another decode still handshakes', async () => {
  const C = await makeNode('tcp', null, { engineId: 'refresh-consumer' });
  const P = await makeNode('tcp', 1, { engineId: 'refresh-producer' });
  const { host, port } = P.engine.address();
  const d = new PeerDirectory((peer) => C.engine.handshake(peer), env, ['loopback']);
  let other: Awaited<ReturnType<typeof makeNode>> | null = null;
  try {
    assert.equal(await d.resolve(host, port, P.engine.engineId), P.engine.engineId);
    await env.sleep(50);
    const fdsBefore = openFds();
    // More refreshes than the producer accepts side channels (256): one per distinct stale engine id.
    const refreshes = 300;
    for (let i = 0; i < refreshes; i++) {
      assert.equal(d.statusFor(host, port, `stale-engine-${i}`).state, 'connecting', `refresh ${i} dials again`);
      await eventually(`refresh ${i} settled`, () => d.peek(host, port)?.state !== 'connecting');
      assert.deepEqual(d.peek(host, port), { state: 'ready', engineId: P.engine.engineId }, `refresh ${i}`);
    }
    // Both ends of every replaced side channel are closed: the process holds no more sockets than before.
    await eventually(`fds back to ${fdsBefore} (now ${openFds()})`, () => openFds() <= fdsBefore);
    other = await makeNode('tcp', null, { engineId: 'refresh-other-decode' });
    const meta = await other.engine.handshake({ host, port });
    assert.equal(meta.engineId, P.engine.engineId, 'the producer still accepts another decode');
    // The refreshed channel works: a notification from the consumer reaches the producer.
    let delivered = 0;
    P.engine.onNotification(() => delivered++);
    await C.engine.notify(P.engine.engineId, { type: 'release', transferId: 'none', payload: { grant: 'x' } });
    await eventually('the notification arrived', () => delivered === 1);
  } finally {
    await Promise.all([C.engine.close(), P.engine.close(), other?.engine.close()]);
  }
});
