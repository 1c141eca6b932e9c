/**
 * Prefill in WRITE mode issues no grant, so a `release` names a transfer by its id alone: any peer (or a
 * client, through decode's POST /handoff/release or a decode request refused at admission) can send one
 * for a transfer id that is not held yet. It was kept as "released early" and applied to the next
 * transfer under that id: its pages were reported free at once, while the push from them, started in
 * the same step because decode had already said where to write, still read them (the guard for a
 * release during a push was skipped on this path), so the pool could hand them to another request while
 * the NIC sent them to decode. Such an early release is now dropped when the transfer is held if a decode
 * already said where to write it (a legitimate early release comes from a decode that never will: its
 * request was refused or aborted before allocation, so it is still honoured).
 * Driven through the real OneSidedConnectorWorker over a recording transfer engine (write_release.test.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeProducerRig } from './write_producer_testkit.ts';

test('WRITE producer: a release before the transfer is held does not free its pages under the push', async () => {
  const { h, worker, step, notify, destination } = writeProducerRig();
  // A release of T that ends nothing (T is not held): prefill issued no grant, so nothing checks it.
  notify('decode-1', { type: 'release', transferId: 'T', payload: { grant: '' } });
  // Decode (the one the transfer belongs to) says where to write before prefill finished.
  destination();
  // Request R under T finishes: its pages [1,2,3] are held and final; the push starts in this step.
  const so1 = step(1, (m) => {
    m.sendTransfers = { T: 'R' };
    m.reqsToSave = [{ requestId: 'R', transferId: 'T', localBlockIds: [[1, 2, 3]] }];
  });
  await worker.preForward(so1);
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(h.posted, ['T'], 'the WRITE from pages 1..3 is in flight');
  const out1 = await worker.postForward(so1);
  assert.deepEqual(
    out1.finishedSending,
    [],
    `R reported free (its pages go back to the pool) while the WRITE still reads them: ${JSON.stringify(out1.finishedSending)}`,
  );
  h.finishWrite!();
  await new Promise((r) => setImmediate(r));
  const so2 = step(2, (m) => (m.sendTransfers = { T: 'R' }));
  await worker.preForward(so2);
  assert.deepEqual((await worker.postForward(so2)).finishedSending, ['R'], 'reported when the push ended, once');
});
