/**
 * Proves that a peer's data connections end with the peer. When the last side channel to a peer closes
 * the engine forgets it (unpeer: its sessions and our connections to it go), but the connections it
 * opened to our data port stayed open and authenticated forever. A client that handshakes (no secret
 * set), opens a data connection, says hello and closes its side channel, 256 times under as many engine
 * ids, filled the data port's slots with connections of peers that no longer exist: a real peer's data
 * connection was then refused and its READs failed, for good.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { RealEnv } from '../../util/env.ts';
import { makeNode, pageRanges, readOf, type Node } from '../testing/conformance.ts';
import { greetedDataConn, rawHandshake } from './wire_testkit.ts';

const env = new RealEnv(9);

/** Handshake with `P` as `engineId`, open a data connection with the session it gave, then drop the side channel. */
async function orphanDataConn(P: Node, engineId: string): Promise<net.Socket> {
  const { side, session } = await rawHandshake(P, engineId);
  const data = await greetedDataConn(P, engineId, session);
  side.s.destroy();
  return data;
}

test('data connections of peers that are gone do not keep the data port full', async () => {
  const [P, D] = await Promise.all([
    makeNode('tcp', 71, { engineId: 'orphanP' }),
    makeNode('tcp', null, { engineId: 'orphanD', lanes: 1 }),
  ]);
  const orphans: net.Socket[] = [];
  try {
    for (let i = 0; i < 256; i++) orphans.push(await orphanDataConn(P, `gone-${i}`));
    await env.sleep(200); // the side channels' close reached the NIC
    await D.engine.handshake(P.engine.address());
    const g = P.engine.issueGrant({ transferId: 't', peerEngineId: D.engine.engineId, blockIds: [1], ttlMs: 10_000 });
    const h = D.engine.postRead(readOf(P, 't', g.token, pageRanges([[1, 2]])));
    await D.engine.wait([h], 3000);
    assert.equal(D.engine.poll(h).state, 'done');
    assert.ok(
      orphans.every((s) => s.destroyed || s.readableEnded),
      'the data connections of the gone peers were closed',
    );
  } finally {
    for (const s of orphans) s.destroy();
    await Promise.all([P.engine.close(), D.engine.close()]);
  }
});
