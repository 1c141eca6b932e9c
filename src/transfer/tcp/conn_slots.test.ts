/**
 * Proves that connections which never say hello cannot lock real peers out. Both tcp listeners cap their
 * connections at 256 and refused every connection past the cap, so a client holding 256 idle sockets
 * (no bytes, no handshake: nothing to authenticate, the shared secret does not help) made a real
 * peer's data connection and handshake fail at once, for as long as it reconnected every few seconds.
 * Now a newcomer past the cap takes the slot of the oldest connection still without hello/handshake.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { RealEnv } from '../../util/env.ts';
import { assertLanded, makeNode, pageRanges, readOf } from '../testing/conformance.ts';

const env = new RealEnv(7);
const SLOTS = 256;

/** `n` sockets to `port` that send nothing; resolves once all are connected. */
async function idleSockets(port: number, n: number): Promise<net.Socket[]> {
  const sockets = Array.from({ length: n }, () => {
    const s = net.connect({ host: '127.0.0.1', port });
    s.on('error', () => {});
    s.on('data', () => {});
    return s;
  });
  await Promise.all(sockets.map((s) => new Promise<void>((resolve) => s.once('connect', () => resolve()))));
  await env.sleep(100); // the server accepted them all
  return sockets;
}

test('256 idle sockets on the data port do not stop a real peer from reading', async () => {
  const [P, D] = await Promise.all([
    makeNode('tcp', 41, { engineId: 'slotP' }),
    makeNode('tcp', null, { engineId: 'slotD', lanes: 1 }),
  ]);
  const idle = await idleSockets(P.engine.ports().data, SLOTS);
  try {
    await D.engine.handshake(P.engine.address());
    const g = P.engine.issueGrant({ transferId: 't', peerEngineId: D.engine.engineId, blockIds: [1], ttlMs: 10_000 });
    const h = D.engine.postRead(readOf(P, 't', g.token, pageRanges([[1, 2]])));
    await D.engine.wait([h], 3000);
    assert.equal(D.engine.poll(h).state, 'done', `the READ failed: ${JSON.stringify(D.engine.poll(h))}`);
    assertLanded(D, P, [[1, 2]]);
  } finally {
    for (const s of idle) s.destroy();
    await Promise.all([P.engine.close(), D.engine.close()]);
  }
});

test('256 idle sockets on the side channel do not stop a real peer from handshaking', async () => {
  const [P, D] = await Promise.all([
    makeNode('tcp', 42, { engineId: 'sideP', sideChannelSecret: 's3cret' }),
    makeNode('tcp', null, { engineId: 'sideD', sideChannelSecret: 's3cret' }),
  ]);
  const idle = await idleSockets(P.engine.address().port, SLOTS);
  try {
    const meta = await D.engine.handshake(P.engine.address());
    assert.equal(meta.engineId, P.engine.engineId);
  } finally {
    for (const s of idle) s.destroy();
    await Promise.all([P.engine.close(), D.engine.close()]);
  }
});
