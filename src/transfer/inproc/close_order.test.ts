/**
 * inproc: a producer that closes while its NIC thread copies a READ into the consumer's slab lets the
 * copy end before the consumer learns it is gone. Once the consumer's READ has settled (failed or done),
 * no byte of its pages changes any more: the connector reuses the pages of a failed READ. Before, the
 * READ failed at once (the peer was told before the NIC closed) while the copy went on writing.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { makeNode, readOf, SENTINEL } from '../testing/conformance_support.ts';

const PAGE = 1 << 20;
const BLOCKS = 32;
const layout = { numSlabs: 2, numBlocks: BLOCKS, pageBytes: PAGE };

test('inproc: after a READ settles because its producer closed mid-copy, nothing lands in its pages', async () => {
  let closedMidCopy = 0;
  for (let attempt = 0; attempt < 4; attempt++) {
    const P = await makeNode('inproc', null, { layout, engineId: `close-P${attempt}` });
    for (const sl of P.slabs) sl.fill(0x5a);
    const D = await makeNode('inproc', null, { layout, engineId: `close-D${attempt}` });
    try {
      await D.engine.handshake(P.engine.address());
      const blocks = [...Array(BLOCKS).keys()];
      const grant = { transferId: 't', peerEngineId: D.engine.engineId, blockIds: blocks, ttlMs: 60_000 };
      const { token } = P.engine.issueGrant(grant);
      const ranges = [0, 1].map((slab) => ({ slab, localOffset: 0, remoteOffset: 0, length: BLOCKS * PAGE }));
      const h = D.engine.postRead(readOf(P, 't', token, ranges));
      const first = D.slabs[0] as Uint8Array;
      const t0 = Date.now();
      while (first[0] === SENTINEL && Date.now() - t0 < 2000); // spin: the copy starts on P's NIC thread
      const closing = P.engine.close();
      // catch-ok: the READ may fail (PEER_UNAVAILABLE) or finish; either way it has settled
      await D.engine.wait([h], 10_000).catch(() => undefined);
      // One byte per page, read at once (a copy of the slabs would take as long as the NIC's copy).
      const sample = (): number[] =>
        D.slabs.flatMap((sl) => Array.from({ length: BLOCKS }, (_, b) => sl[(b + 1) * PAGE - 1] as number));
      const settled = sample();
      if (D.engine.poll(h).state === 'failed' && settled.includes(SENTINEL)) closedMidCopy++;
      await closing;
      await new Promise((r) => setTimeout(r, 300));
      assert.deepEqual(sample(), settled, 'a page changed after the READ settled');
    } finally {
      await Promise.all([P.engine.close(), D.engine.close()]);
    }
  }
  // The property holds whatever the timing; say how often the READ settled failed with pages still unwritten.
  console.log(`# settled failed with pages not yet written: ${closedMidCopy} of 4`);
});
