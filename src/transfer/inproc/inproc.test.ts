/**
 * Runs the transfer conformance suite (conformance.ts) against the inproc backend, plus what only inproc
 * has: its registry rule, and the direct path (engine straight to the peer's NIC, direct_link.ts) under
 * aborts and a closing peer.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { assertLanded, makeNode, pageRanges, readOf, transferConformance } from '../testing/conformance.ts';

transferConformance('inproc');

test('inproc: a second engine with a live engine id is refused with BAD_CONFIG; the id is free again after close', async () => {
  const a = await makeNode('inproc', 1, { engineId: 'dup' });
  const id = a.engine.engineId;
  await assert.rejects(
    makeNode('inproc', 2, { engineId: id }).then(async (n) => (await n.engine.close(), n)),
    (e: Error & { code?: string }) => e.code === 'BAD_CONFIG',
  );
  await a.engine.close();
  const b = await makeNode('inproc', 3, { engineId: id });
  assert.equal(b.engine.engineId, id);
  await b.engine.close();
});

test('inproc direct path: aborts right after posting resolve, each READ ends once (the peer copies before it answers the abort)', async () => {
  const [P, D] = await Promise.all([makeNode('inproc', 4), makeNode('inproc', null)]);
  try {
    await D.engine.handshake(P.engine.address());
    const { token } = P.engine.issueGrant({
      transferId: 't',
      peerEngineId: D.engine.engineId,
      blockIds: [1, 2, 3],
      ttlMs: 10_000,
    });
    const hs = [1, 2, 3].map((b) => D.engine.postRead(readOf(P, 't', token, pageRanges([[b, b]]))));
    await D.engine.abort(hs);
    for (const h of hs) {
      const r = D.engine.poll(h);
      assert.ok(r.state === 'done' || (r.state === 'failed' && r.error.code === 'REQUEST_ABORTED'), r.state);
    }
    // Same port, in order: every READ was served before its abort was answered.
    assertLanded(D, P, [
      [1, 1],
      [2, 2],
      [3, 3],
    ]);
    await D.engine.abort(hs); // again, after the end: at once
  } finally {
    await Promise.all([P.engine.close(), D.engine.close()]);
  }
});

test('inproc direct path: the peer closing under posted READs ends each one, done or PEER_UNAVAILABLE, never hung', async () => {
  const [P, D] = await Promise.all([makeNode('inproc', 5), makeNode('inproc', null)]);
  try {
    await D.engine.handshake(P.engine.address());
    const { token } = P.engine.issueGrant({
      transferId: 't',
      peerEngineId: D.engine.engineId,
      blockIds: [4, 5],
      ttlMs: 10_000,
    });
    const hs = [4, 5].map((b) => D.engine.postRead(readOf(P, 't', token, pageRanges([[b, b]]))));
    await P.engine.close();
    for (const h of hs) {
      const err = await D.engine.wait([h], 5000).then(
        () => null,
        (e: unknown) => e as Error & { code?: string },
      );
      assert.ok(err === null || err.code === 'PEER_UNAVAILABLE', String(err));
    }
  } finally {
    await Promise.all([P.engine.close(), D.engine.close()]);
  }
});
