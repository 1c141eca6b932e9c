/**
 * WRITE mode: a decode request refused at admission as the duplicate of a live load (same transfer_id,
 * another request id: a client or proxy retry) must leave the live load alone. The refusal queued a
 * `release` naming the transfer, i.e. the live load's: prefill, told where to write but not yet pushing,
 * dropped the push and freed its pages, and the live request waited out its load deadline (30 s by
 * default) before recomputing. Decode's scheduler side and prefill's worker side are the real ones; the
 * decode step's metadata is carried to prefill as its worker would (remote_blocks, then the releases).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fakeRun, makeRequest } from './scheduler_testkit.ts';
import type { OneSidedMetadata } from '../worker/connector_metadata.ts';
import { writePairWithHeldTransfer } from './write_pair_testkit.ts';

test('WRITE: a refused duplicate of a live load does not release the transfer; prefill still pushes', async () => {
  // Prefill finished the request: its pages [1, 2, 3] are held and final, waiting for decode's destination.
  const { scheduler, prefill, params } = await writePairWithHeldTransfer();
  // Decode: the live request and its retry under the same transfer id arrive together.
  scheduler.addRequest(makeRequest(40, 4, params(), 'live'));
  scheduler.addRequest(makeRequest(40, 4, params(), 'retry'));
  const so = scheduler.schedule();
  const refused = scheduler.updateFromOutput(so, fakeRun(so)).find((o) => o.requestId === 'retry');
  assert.equal(refused?.error?.code, 'BAD_TRANSFER_PARAMS', 'the retry is refused');
  const meta = so.kvConnectorMetadata as OneSidedMetadata;
  assert.deepEqual(
    meta.reqsToNotify.map((n) => n.requestId),
    ['live'],
    'the live request waits for the push',
  );
  // Decode's worker: remote_blocks for every notice, then a release for every READ entry (an empty one
  // for a request that will never load).
  for (const n of meta.reqsToNotify) {
    const payload = { blockIds: n.localBlockIds, skipBlocks: n.skipBlocks, endToken: n.endToken, grant: 'cd' };
    prefill.notify({ type: 'remote_blocks', transferId: n.transferId, payload });
  }
  for (const r of meta.reqsToRecv) prefill.notify({ type: 'release', transferId: r.transferId, payload: {} });
  prefill.worker.saves.startReadySaves();
  assert.deepEqual(prefill.posted, ['T'], "prefill pushes the live request's KV (the retry released it)");
  assert.equal(scheduler.numWaiting, 1, 'the live request is parked for its load');
});
