/**
 * Prefill in WRITE mode: a `release` that arrives while the push from a request's pages is under way
 * does not report the request (its pages would be freed, and maybe reused, while the NIC still reads
 * them for the WRITE); the push's end reports it, once. (In WRITE mode prefill issues no grant, so the
 * release cannot be checked against one: any decode request naming the transfer that is refused before
 * allocation sends it.) Driven through the real OneSidedConnectorWorker (its notification routing,
 * Producer, WriteProducer) over a recording transfer engine whose WRITE ends when the test says.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeProducerRig } from './write_producer_testkit.ts';

test("WRITE producer: a release during the push does not report the pages; the push's end does, once", async () => {
  const { h, worker, step, notify, destination } = writeProducerRig();
  // Step 1: request R finished, its pages [1,2,3] are held and final (save); the scheduler names them held.
  const so1 = step(1, (m) => {
    m.sendTransfers = { T: 'R' };
    m.reqsToSave = [{ requestId: 'R', transferId: 'T', localBlockIds: [[1, 2, 3]] }];
  });
  await worker.preForward(so1);
  // Decode says where to write: the push starts.
  destination();
  worker.saves.startReadySaves();
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(h.posted, ['T'], 'the WRITE from pages 1..3 is in flight');
  assert.notEqual(h.finishWrite, null, 'and not finished');
  // A release for T arrives (WRITE mode: prefill has no grant for T, so nothing checks it).
  notify('decode-0', { type: 'release', transferId: 'T', payload: { grant: '' } });
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
  const out2 = await worker.postForward(so2);
  assert.deepEqual(out2.finishedSending, ['R'], 'reported when the push ended');
  const so3 = step(3, () => undefined);
  await worker.preForward(so3);
  assert.deepEqual((await worker.postForward(so3)).finishedSending, [], 'and only once');
});
