/**
 * Proves that one peer cannot take every slot of the data port. A peer with a session (any client that
 * handshakes when no secret is set) could open 256 data connections with it, each greeted and kept
 * forever: every other peer's data connection was then refused and its READs failed. Now a peer holds
 * at most PEER_CONNECTIONS_MAX connections; its hello past that closes its own oldest one (which also
 * clears connections half-open after link cuts, where no FIN ever arrived).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type net from 'node:net';
import { RealEnv } from '../../util/env.ts';
import { makeNode, pageRanges, readOf } from '../testing/conformance.ts';
import { greetedDataConn, rawHandshake } from './wire_testkit.ts';
import { PEER_CONNECTIONS_MAX } from './nic_tcp.ts';

const env = new RealEnv(11);

test('one peer opening 256 data connections does not lock another peer out', async () => {
  const [P, D] = await Promise.all([
    makeNode('tcp', 81, { engineId: 'capP' }),
    makeNode('tcp', null, { engineId: 'capD', lanes: 1 }),
  ]);
  const greedy: net.Socket[] = [];
  const { side, session } = await rawHandshake(P, 'greedy');
  try {
    for (let i = 0; i < 256; i++) greedy.push(await greetedDataConn(P, 'greedy', session));
    await env.sleep(100);
    const open = greedy.filter((s) => !s.destroyed && !s.readableEnded).length;
    await D.engine.handshake(P.engine.address());
    const g = P.engine.issueGrant({ transferId: 't', peerEngineId: D.engine.engineId, blockIds: [1], ttlMs: 10_000 });
    const h = D.engine.postRead(readOf(P, 't', g.token, pageRanges([[1, 2]])));
    await D.engine.wait([h], 3000);
    assert.equal(D.engine.poll(h).state, 'done');
    assert.ok(open <= PEER_CONNECTIONS_MAX, `the greedy peer holds ${open} data connections`);
  } finally {
    side.s.destroy();
    for (const s of greedy) s.destroy();
    await Promise.all([P.engine.close(), D.engine.close()]);
  }
});
