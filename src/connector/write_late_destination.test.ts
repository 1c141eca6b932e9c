/**
 * Prefill in WRITE mode: a `release` that came before its transfer was held, with no destination yet, is
 * honoured when the transfer is held (its pages are reported free). A destination that arrives after
 * that (the step's forward, or before the next step's metadata under async scheduling, which still names
 * the transfer) must not start a push from those pages: they were reported free and may belong to
 * another request while the NIC sends them to decode (decode gets another request's KV). Who sends such
 * a release: a decode that refused a request under that transfer id (draining, overloaded, too long)
 * while the client's retry under the same params went to another decode and says where to write.
 * Invariant checked: no WRITE is posted from pages reported free before it ended; the request is
 * reported once. Driven through the real OneSidedConnectorWorker over a recording transfer engine
 * (write_release.test.ts, write_early_release.test.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeProducerRig } from './write_producer_testkit.ts';

const tick = () => new Promise((r) => setImmediate(r));

test('WRITE producer: a destination during the forward of the step that honours an early release pushes nothing from the freed pages', async () => {
  const { h, worker, step, notify, destination } = writeProducerRig();
  // A decode that refused its request under T releases T before prefill holds it; no destination yet.
  notify('decode-1', { type: 'release', transferId: 'T', payload: { grant: '' } });
  // Request R under T finishes: its pages [1,2,3] are held and final; the early release applies.
  const so1 = step(1, (m) => {
    m.sendTransfers = { T: 'R' };
    m.reqsToSave = [{ requestId: 'R', transferId: 'T', localBlockIds: [[1, 2, 3]] }];
  });
  await worker.preForward(so1);
  // During the forward, the retry's decode says where to write T.
  destination();
  const out1 = await worker.postForward(so1);
  await tick();
  const reported = out1.finishedSending.includes('R');
  assert.ok(
    !(reported && h.posted.length > 0),
    `R reported free (its pages go back to the pool) while a WRITE from them is in flight: posted ${JSON.stringify(h.posted)}`,
  );
  h.finishWrite?.();
  await tick();
  let times = reported ? 1 : 0;
  for (let n = 2; n <= 4; n++) {
    const so = step(n, (m) => (m.sendTransfers = n === 2 && !reported ? { T: 'R' } : {}));
    await worker.preForward(so);
    times += (await worker.postForward(so)).finishedSending.filter((id) => id === 'R').length;
  }
  assert.equal(times, 1, 'R reported once');
});

test('WRITE producer: a destination after an early release was reported (async scheduling) pushes nothing from the freed pages', async () => {
  const { h, worker, step, notify, destination } = writeProducerRig();
  notify('decode-1', { type: 'release', transferId: 'T', payload: { grant: '' } });
  const so1 = step(1, (m) => {
    m.sendTransfers = { T: 'R' };
    m.reqsToSave = [{ requestId: 'R', transferId: 'T', localBlockIds: [[1, 2, 3]] }];
  });
  await worker.preForward(so1);
  await tick();
  const out1 = await worker.postForward(so1);
  assert.deepEqual(out1.finishedSending, ['R'], 'the early release frees R (its decode never loads)');
  // Step 2 was scheduled one step ahead, before step 1's output freed R: its metadata still names T held.
  destination();
  const so2 = step(2, (m) => (m.sendTransfers = { T: 'R' }));
  await worker.preForward(so2);
  await tick();
  assert.deepEqual(h.posted, [], 'a WRITE was posted from pages already reported free (the pool reuses them)');
  await worker.postForward(so2);
});
