/**
 * A range of 2^32 bytes (a whole 4 GiB slab, read in one request: its pages coalesce into one
 * range) cannot be encoded in a READ frame (u32 length): the NIC thread's frame encoder asserts and the
 * process goes down. It must either be split on the wire or fail the request, never crash.
 * No grant is issued, so the peer refuses the READ and no byte moves (the 4 GiB slabs stay untouched).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createTransferEngine } from '../factory.ts';
import { RealEnv } from '../../util/env.ts';
import { HandoffError } from '../../util/errors.ts';
import { label } from '../testing/conformance_support.ts';

const layout = { numSlabs: 1, numBlocks: 65536, pageBytes: 65536, tensorParallelSize: 1 };

async function engine(id: string) {
  return createTransferEngine({
    backend: 'tcp',
    env: new RealEnv(1),
    engineId: id,
    modelName: 'tiny',
    preset: 'dsv4-mini',
    blockSizes: [16, 16],
    layout,
    slabs: [new SharedArrayBuffer(layout.numBlocks * layout.pageBytes)],
  });
}

test('a READ of a whole 4 GiB slab fails cleanly (no grant) instead of crashing the NIC thread', async () => {
  const [P, D] = await Promise.all([engine('P4g'), engine('D4g')]);
  try {
    await D.handshake(P.address());
    const h = D.postRead({
      peerEngineId: P.engineId,
      transferId: 'whole-slab',
      grantToken: 'ab'.repeat(16),
      label,
      footprint: [],
      ranges: Array.from({ length: layout.numBlocks }, (_, b) => ({
        slab: 0,
        localOffset: b * layout.pageBytes,
        remoteOffset: b * layout.pageBytes,
        length: layout.pageBytes,
      })),
    });
    assert.equal(h.descriptors, 1, 'the pages coalesce into one range of 2^32 bytes');
    await assert.rejects(D.wait([h], 10_000), (e: unknown) => e instanceof HandoffError && e.code === 'GRANT_DENIED');
  } finally {
    await Promise.all([P.close(), D.close()]);
  }
});
