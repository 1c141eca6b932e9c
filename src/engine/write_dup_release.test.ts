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
import { carryToPrefill, writePairWithHeldTransfer } from './write_pair_testkit.ts';

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
  carryToPrefill(prefill, meta);
  assert.deepEqual(prefill.h.posted, ['T'], "prefill pushes the live request's KV (the retry released it)");
  assert.equal(scheduler.numWaiting, 1, 'the live request is parked for its load');
});
