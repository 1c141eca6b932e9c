/**
 * Proves: prefill's WRITE connector bounds what it keeps for transfers it has no save or hold of by
 * dropping the oldest entry, never all of them at once.
 *  - Destinations: at ORPHAN_DESTINATIONS_MAX the next destination for an unknown transfer dropped every
 *    destination waiting for its save, including those of requests prefill was still computing: such a
 *    request was never pushed (decode waited its whole transfer timeout and recomputed; prefill held the
 *    pages to the lease).
 *  - Early releases: at EARLY_RELEASES_MAX the next release of an unknown transfer dropped every early
 *    release, so a request its decode had released before prefill finished held its pages for the lease.
 * Before the fix both tests failed (nothing pushed; R never freed). Unsaved destinations and early releases
 * pile up in normal serving (aborted or refused requests): sim/write_unsaved.test.ts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { EARLY_RELEASES_MAX } from './producer.ts';
import { ORPHAN_DESTINATIONS_MAX } from './write_producer.ts';
import { writeProducerRig } from './write_producer_testkit.ts';

const tick = () => new Promise((r) => setImmediate(r));

test('WRITE producer: the bound on unsaved destinations drops the oldest, not a live request awaiting its save', async () => {
  const { h, worker, step, notify } = writeProducerRig();
  const dest = (transferId: string) =>
    notify('decode-0', {
      type: 'remote_blocks',
      transferId,
      payload: { blockIds: [[7, 8, 9]], skipBlocks: 0, endToken: 40, grant: 'cd'.repeat(16) },
    });
  for (let i = 0; i < ORPHAN_DESTINATIONS_MAX - 1; i++) dest(`gone-${i}`);
  // Request R under T is being computed on prefill; its decode already said where to write.
  dest('T');
  dest('gone-last'); // one more transfer that prefill never saves
  // R finishes: its pages are final.
  const so = step(1, (m) => {
    m.sendTransfers = { T: 'R' };
    m.reqsToSave = [{ requestId: 'R', transferId: 'T', localBlockIds: [[1, 2, 3]] }];
  });
  await worker.preForward(so);
  await tick();
  assert.deepEqual(h.posted, ['T'], 'R was pushed to the destination its decode announced');
  h.finishWrite?.();
  await worker.postForward(so);
});

test('WRITE producer: the bound on early releases drops the oldest, not the one a transfer held next needs', async () => {
  const { worker, step, notify } = writeProducerRig();
  const release = (transferId: string) => notify('decode-1', { type: 'release', transferId, payload: { grant: '' } });
  for (let i = 0; i < EARLY_RELEASES_MAX - 1; i++) release(`gone-${i}`);
  release('T'); // decode refused the request under T while prefill still computes it
  release('gone-last');
  // R under T finishes and is held: the release that came first applies, R's pages are freed now.
  const so1 = step(1, (m) => {
    m.sendTransfers = { T: 'R' };
    m.reqsToSave = [{ requestId: 'R', transferId: 'T', localBlockIds: [[1, 2, 3]] }];
  });
  await worker.preForward(so1);
  await tick();
  const freed = [...(await worker.postForward(so1)).finishedSending];
  for (let n = 2; n <= 3 && !freed.includes('R'); n++) {
    const so = step(n, (m) => (m.sendTransfers = { T: 'R' }));
    await worker.preForward(so);
    await tick();
    freed.push(...(await worker.postForward(so)).finishedSending);
  }
  assert.ok(freed.includes('R'), 'R is held to its lease although its decode released it');
});
