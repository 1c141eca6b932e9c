/**
 * A laned READ whose grant is refused must not fail the other READs riding the same lanes.
 *
 * When one part of a laned READ fails (GRANT_DENIED: pages not granted, or a lease that ended), the plane
 * aborts its other parts. ClientConn.abort took any READ on which no byte had arrived since its post for a
 * stalled link and dropped the whole connection; but the sibling part had just been posted (its own
 * denial was still on the wire), so every other READ in flight on that lane failed with PEER_UNAVAILABLE
 * ("no data from P since READ n was posted: connection dropped"): one refused request cost a concurrent,
 * valid one its load (20 of 20 times before the fix).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { makeNode, readOf } from '../testing/conformance.ts';

const PAGE = 16384;
const LAYOUT = { numSlabs: 1, numBlocks: 256, pageBytes: PAGE };

test('a laned READ refused by the grant leaves a concurrent valid READ on the same lanes intact', async () => {
  const opts = { layout: LAYOUT, lanes: 2, laneMinBytes: 2 * PAGE, dataFrameBytes: 1 << 16 };
  const [P, D] = await Promise.all([
    makeNode('tcp', 3, { engineId: 'P', ...opts }),
    makeNode('tcp', null, { engineId: 'D', ...opts }),
  ]);
  try {
    await D.engine.handshake(P.engine.address());
    const granted = Array.from({ length: 128 }, (_, i) => i);
    const g = P.engine.issueGrant({
      transferId: 't',
      peerEngineId: D.engine.engineId,
      blockIds: granted,
      ttlMs: 60_000,
    });
    const ranges = (blocks: number[]) =>
      blocks.map((b) => ({ slab: 0, localOffset: b * PAGE, remoteOffset: b * PAGE, length: PAGE }));
    // Both lanes open and warm.
    await D.engine.wait([D.engine.postRead(readOf(P, 't', g.token, ranges([0, 1, 2, 3])))], 5000);
    const failures: string[] = [];
    for (let i = 0; i < 10; i++) {
      const refused = D.engine.postRead(readOf(P, 't', g.token, ranges([200, 201, 202, 203]))); // not granted
      const good = D.engine.postRead(readOf(P, 't', g.token, ranges(granted.slice(4, 68))));
      await assert.rejects(D.engine.wait([refused], 5000), { code: 'GRANT_DENIED' });
      await D.engine.wait([good], 5000).catch((e: unknown) => failures.push(String(e)));
    }
    assert.deepEqual(failures, [], 'valid READs failed beside a refused one');
    const src = P.slabs[0] as Uint8Array;
    const dst = D.slabs[0] as Uint8Array;
    assert.ok(Buffer.from(dst.subarray(4 * PAGE, 68 * PAGE)).equals(src.subarray(4 * PAGE, 68 * PAGE)));
  } finally {
    await Promise.all([P.engine.close(), D.engine.close()]);
  }
});
