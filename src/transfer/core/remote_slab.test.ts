/**
 * Proves a work request naming a negative remote slab fails like any other remote range outside the peer's
 * slabs (a failed handle, BAD_TRANSFER_PARAMS: workRequestProblem), instead of throwing a misleading
 * AssertionError ("zero-length range") out of postRead: orderBy's packed sort keys went negative, `key % n`
 * made a negative index, and Uint32Array turned it into 2^32 - 1, so coalescing read past the ranges.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../../util/env.ts';
import { LAYOUT } from '../testing/conformance_support.ts';
import { SimFabric } from '../sim/sim_fabric.ts';
import { SimTransferEngine } from '../sim/sim.ts';
import { coalescePacked, packRanges, sortedBy, unpackRanges } from './ranges.ts';
import type { TransferRange } from './types.ts';

const PB = LAYOUT.pageBytes;
const ranges: TransferRange[] = [
  { slab: 0, localOffset: 0, remoteSlab: 1, remoteOffset: PB, length: PB },
  { slab: 0, localOffset: PB, remoteSlab: -1, remoteOffset: 0, length: PB },
];

test('coalescePacked and sortedBy keep every range when a slab is negative (no index past the ranges)', () => {
  const p = packRanges(ranges);
  const merged = unpackRanges(coalescePacked(p));
  assert.deepEqual(
    merged.map((r) => r.remoteSlab ?? r.slab),
    [-1, 1],
  );
  assert.deepEqual(
    unpackRanges(sortedBy(p, 'remote')).map((r) => r.localOffset),
    [PB, 0],
  );
});

test('postRead with a negative remote slab fails the handle with BAD_TRANSFER_PARAMS', async () => {
  const env = new SimEnv(3);
  const fabric = new SimFabric(false);
  const mk = (engineId: string): SimTransferEngine =>
    new SimTransferEngine({
      env,
      fabric,
      engineId,
      modelName: 'tiny',
      preset: 'dsv4-mini',
      layout: LAYOUT,
      blockSizes: [16, 16],
      slabViews: Array.from({ length: LAYOUT.numSlabs }, () => new Uint8Array(LAYOUT.numBlocks * PB)),
    });
  const [P, D] = [mk('neg-P'), mk('neg-D')];
  const hs = D.handshake(P.address());
  await Promise.resolve();
  fabric.run(fabric.queued()[0]!.id);
  await hs;
  const g = P.issueGrant({ transferId: 't', peerEngineId: 'neg-D', blockIds: [0, 1], ttlMs: 1000 });
  const h = D.postRead({
    peerEngineId: 'neg-P',
    transferId: 't',
    grantToken: g.token,
    ranges,
    label: { what: 'kv-read' },
    footprint: [],
  });
  const r = D.poll(h);
  assert.equal(r.state, 'failed');
  assert.equal(r.state === 'failed' ? r.error.code : '', 'BAD_TRANSFER_PARAMS');
  await Promise.all([P.close(), D.close()]);
});
