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
import { SimEnv } from '../util/env.ts';
import type { Device } from '../device/types.ts';
import type { TransferEngine, Notification } from '../transfer/core/types.ts';
import { fakeRun, makeRequest, makeScheduler } from './scheduler_testkit.ts';
import { emptyOneSidedMetadata, type OneSidedMetadata } from '../worker/connector_metadata.ts';
import { makeEmptySchedulerOutput } from '../worker/scheduler_output.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from '../connector/config.ts';
import { OneSidedConnectorScheduler } from '../connector/one_sided_scheduler.ts';
import { OneSidedConnectorWorker } from '../connector/one_sided_worker.ts';
import type { PeerDirectory } from '../connector/peer_directory.ts';

/** Prefill's worker side (WRITE producer) over a transfer engine that records the WRITEs posted. */
function producerWorker(kv: ReturnType<typeof makeScheduler>['kv']) {
  let handler: ((from: string, n: Notification) => void) | null = null;
  const posted: string[] = [];
  const cfg = kv.config;
  const transfer = {
    onNotification: (h: (from: string, n: Notification) => void) => ((handler = h), () => undefined),
    revokeGrant: () => true,
    drainGrant: () => Promise.resolve(),
    notify: () => Promise.resolve(),
    peerMetadata: () => ({
      engineId: 'decode-0',
      layout: {
        numSlabs: cfg.numLayerSlabs * cfg.tensorParallelSize,
        numBlocks: cfg.numBlocks,
        pageBytes: cfg.pageBytes,
        tensorParallelSize: cfg.tensorParallelSize,
        blockSizes: cfg.groups.map((g) => g.spec.blockSize),
      },
    }),
    postWrite: (w: { transferId: string }) => (posted.push(w.transferId), { id: 1 }),
    wait: () => new Promise<void>(() => undefined),
    abort: () => Promise.resolve(),
  };
  const worker = new OneSidedConnectorWorker(
    { ...DEFAULT_ONE_SIDED_CONFIG, role: 'producer', mode: 'write' },
    cfg,
    transfer as unknown as TransferEngine,
    {} as Device,
    cfg.groups.map((g) => g.groupId),
    new SimEnv(2),
    {} as PeerDirectory,
  );
  return { worker, posted, notify: (n: Notification) => handler!('decode-0', n) };
}

test('WRITE: a refused duplicate of a live load does not release the transfer; prefill still pushes', async () => {
  const { scheduler, kv } = makeScheduler({
    preset: 'llama-mini',
    numBlocks: 64,
    connector: (env, kv) =>
      new OneSidedConnectorScheduler(
        { ...DEFAULT_ONE_SIDED_CONFIG, role: 'consumer', mode: 'write' },
        kv.config,
        env,
        { engineId: 'decode-0', host: '127.0.0.1', port: 7 },
        null,
      ),
  });
  // Prefill finished the request: its pages [1, 2, 3] are held and final, waiting for decode's destination.
  const prefill = producerWorker(kv);
  const so1 = makeEmptySchedulerOutput(1);
  so1.kvConnectorMetadata = {
    ...emptyOneSidedMetadata(),
    sendTransfers: { T: 'R' },
    reqsToSave: [{ requestId: 'R', transferId: 'T', localBlockIds: [[1, 2, 3]] }],
  };
  await prefill.worker.preForward(so1);

  // Decode: the live request and its retry under the same transfer id arrive together.
  const params = () => ({
    do_remote_prefill: true,
    remote_engine_id: 'prefill-0',
    remote_host: '127.0.0.1',
    remote_port: 5,
    transfer_id: 'T',
  });
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
