/**
 * WRITE mode: a decode request that names the transfer of another live request here (a client retry
 * under the same kv_transfer_params) and finishes before it was admitted (its client left while it
 * waited) must leave the live request's transfer alone. The abort queued a `release` naming the
 * transfer, i.e. the live request's: prefill, told where to write but not yet pushing, dropped the push
 * and the live request waited out its load deadline (30 s by default) before recomputing. The refusal
 * at admission was fixed (write_dup_release.test.ts); an abort while waiting was not. Decode's scheduler
 * side and prefill's worker side are the real ones; decode's step metadata is carried to prefill as its
 * worker would (remote_blocks, then the releases), as in write_dup_release.test.ts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { makeRequest } from './scheduler_testkit.ts';
import type { OneSidedMetadata } from '../worker/connector_metadata.ts';
import { DEFAULT_ONE_SIDED_CONFIG, type OneSidedConfig } from '../connector/config.ts';
import { buildInstance } from './build_instance.ts';
import { threadedDevice } from './devices.ts';
import { carryToPrefill, writePairWithHeldTransfer } from './write_pair_testkit.ts';

test('WRITE: a retry aborted while waiting does not release the live request’s transfer; prefill still pushes', async () => {
  // Prefill finished the request: its pages [1, 2, 3] are held and final, waiting for decode's destination.
  const { scheduler, prefill, params } = await writePairWithHeldTransfer();
  // Decode: the live request and its retry under the same transfer id are waiting; the retry's client leaves.
  scheduler.addRequest(makeRequest(40, 4, params(), 'live'));
  scheduler.addRequest(makeRequest(40, 4, params(), 'retry'));
  assert.ok(scheduler.abortRequest('retry'));
  const so = scheduler.schedule();
  const meta = so.kvConnectorMetadata as OneSidedMetadata;
  assert.deepEqual(
    meta.reqsToNotify.map((n) => n.requestId),
    ['live'],
    'the live request waits for the push',
  );
  carryToPrefill(prefill, meta);
  assert.deepEqual(prefill.h.posted, ['T'], "prefill pushes the live request's KV (the aborted retry released it)");
});

test('WRITE: a release of unused params (POST /handoff/release) naming a live load’s transfer is not sent', async () => {
  const env = new RealEnv(4);
  const build = (role: OneSidedConfig['role'], tag: string) =>
    buildInstance(
      {
        preset: 'dsv4-mini',
        modelSeed: 2,
        numBlocks: 64,
        tensorParallelSize: 1,
        asyncScheduling: true,
        scheduler: {},
        idlePollMs: 2,
        makeDevice: threadedDevice('dsv4-mini', 2, false),
        connector: {
          config: { ...DEFAULT_ONE_SIDED_CONFIG, mode: 'write', role, transferTimeoutMs: 60_000 },
          endpoint: { backend: 'inproc', engineId: `rel-live-${tag}`, modelName: 'dsv4-mini', preset: 'dsv4-mini' },
        },
      },
      env,
    );
  const prefill = await build('producer', 'p');
  const decode = await build('consumer', 'd');
  try {
    const conn = prefill.connector!;
    const addr = conn.transfer.address();
    const params = {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_engine_id: conn.transfer.engineId,
      remote_host: addr.host,
      remote_port: addr.port,
      transfer_id: 'rel-live-t',
    };
    const done = decode.engine
      .generate({
        requestId: 'rel-live-r',
        promptTokenIds: Array.from({ length: 40 }, (_, k) => (k * 31) % 50000),
        sampling: { maxTokens: 2, ignoreEos: true },
        kvTransferParams: { ...params },
      })
      .catch((e: Error) => e);
    // Parked for the WRITE (prefill never computes it: nobody pushes).
    for (let k = 0; k < 400 && decode.engine.kv.getNumFreeBlocks() === 63; k++) await env.sleep(5);
    assert.ok(decode.engine.kv.getNumFreeBlocks() < 63, 'pages allocated for the WRITE load');
    // Someone posts the same params to decode's POST /handoff/release: prefill would drop the live push.
    assert.equal(decode.engine.releaseUnused({ ...params }), false, "a release of the live load's transfer was queued");
    decode.engine.abort('rel-live-r');
    await done;
  } finally {
    await decode.engine.close();
    await prefill.engine.close();
  }
});
