/**
 * Proves that a handshake naming the engine id of a peer we already have a live side channel to, from
 * another data address (an impostor on another port, or two engines given one id), is refused, and
 * traffic to the real peer is untouched. Before, the newcomer silently took the id over: the NIC was
 * pointed at its data port (the real peer's connections dropped, their work requests failing) and every
 * later READ other requests posted to that engine went to it, landing its bytes as their KV; on the
 * listening side every later WRITE to that engine went to it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { makeNode, page, pageRanges, readOf, type Node } from '../testing/conformance.ts';
import { isHandoffError } from '../../util/errors.ts';
import type { Nic } from '../core/nic.ts';

/** The outcome of a promise, without throwing: 'ok', or the error's code. */
async function outcome(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return 'ok';
    // catch-ok: the test compares outcomes; anything but a HandoffError is rethrown
  } catch (e) {
    if (!isHandoffError(e)) throw e;
    return e.code;
  }
}

/** Let `n` serve `transferId` with `token` to `peer` as its real grant holder would (what an impostor does). */
function forgeGrant(n: Node, transferId: string, token: string, peer: string, blockIds: number[]): void {
  (n.engine as unknown as { nic: Nic }).nic.grant(transferId, token, peer, blockIds, 10_000);
}

test('dialer: a second engine answering with a connected peer id is refused; READs still reach the real peer', async () => {
  const [P, D] = await Promise.all([makeNode('tcp', 51, { engineId: 'realP' }), makeNode('tcp', null, { lanes: 1 })]);
  const M = await makeNode('tcp', 77, { engineId: 'realP' }); // same id, other ports, other bytes
  try {
    await D.engine.handshake(P.engine.address());
    const g = P.engine.issueGrant({ transferId: 't', peerEngineId: D.engine.engineId, blockIds: [1], ttlMs: 10_000 });
    forgeGrant(M, 't', g.token, D.engine.engineId, [1]);
    const clash = await outcome(D.engine.handshake(M.engine.address()));
    const h = D.engine.postRead(readOf(P, 't', g.token, pageRanges([[1, 2]])));
    const read = await outcome(D.engine.wait([h], 3000));
    const fromImpostor = [0, 1].some((s) => Buffer.from(page(D, s, 2)).equals(page(M, s, 1)));
    assert.equal(fromImpostor, false, 'the READ landed the impostor bytes');
    assert.equal(read, 'ok', 'the READ from the real peer succeeds');
    for (const s of [0, 1]) assert.deepEqual(page(D, s, 2), page(P, s, 1));
    assert.equal(clash, 'PEER_INCOMPATIBLE', 'the clashing handshake is refused');
  } finally {
    await Promise.all([P.engine.close(), D.engine.close(), M.engine.close()]);
  }
});

test('listener: a hello naming a connected peer id from another data address is refused; WRITEs still reach it', async () => {
  const [P, D] = await Promise.all([makeNode('tcp', 52, { lanes: 1 }), makeNode('tcp', null, { engineId: 'realD' })]);
  const I = await makeNode('tcp', null, { engineId: 'realD' });
  try {
    await D.engine.handshake(P.engine.address());
    const g = D.engine.issueGrant({ transferId: 'w', peerEngineId: P.engine.engineId, blockIds: [3], ttlMs: 10_000 });
    forgeGrant(I, 'w', g.token, P.engine.engineId, [3]);
    const clash = await outcome(I.engine.handshake(P.engine.address()));
    const h = P.engine.postWrite(readOf(D, 'w', g.token, pageRanges([[3, 4]])));
    const write = await outcome(P.engine.wait([h], 3000));
    assert.equal(write, 'ok', 'the WRITE to the real peer succeeds');
    for (const s of [0, 1]) assert.deepEqual(page(D, s, 3), page(P, s, 4));
    assert.equal(clash, 'PEER_INCOMPATIBLE', 'the clashing handshake is refused');
  } finally {
    await Promise.all([P.engine.close(), D.engine.close(), I.engine.close()]);
  }
});
