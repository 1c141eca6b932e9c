/**
 * Async READ loads (async_read) keep their READ in the worker's READ table (READS_MAX entries, an
 * assertion beyond) for as long as it is in flight, and the scheduler parks every waiting request whose
 * pages fit: parked requests take no token budget and no running slot, and the waiting queue holds
 * maxWaiting (4096 by default) of them. With a slow or hung producer (READs wait up to
 * transfer_timeout_ms), a full queue of parked loads plus one aborted request whose READ is still being
 * aborted (its entry stays until the NIC acknowledged) makes the next admitted load the 4097th entry: the
 * worker's assertion kills the engine loop and every request on the instance fails. This proves it with
 * the real Scheduler, OneSidedConnectorScheduler and ReadConsumer (READs that never land): the scheduler
 * must not post more async READs than the worker can hold; the surplus waits in the queue.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import { KVCacheManager } from '../kv/kv_cache_manager.ts';
import { DEFAULT_ONE_SIDED_CONFIG, type OneSidedConfig } from '../connector/config.ts';
import { OneSidedConnectorScheduler } from '../connector/one_sided_scheduler.ts';
import type { PeerDirectory } from '../connector/peer_directory.ts';
import { ReadConsumer, READS_MAX } from '../connector/read_consumer.ts';
import { readContext } from '../connector/read_consumer_testkit.ts';
import type { OneSidedMetadata } from '../worker/connector_metadata.ts';
import { DEFAULT_SCHEDULER_CONFIG, Scheduler } from './scheduler.ts';
import { makeRequest } from './scheduler_testkit.ts';

test('async READs: a full queue of parked loads and an aborted one do not overflow the READ table', async () => {
  const env = new SimEnv(5);
  const config: OneSidedConfig = { ...DEFAULT_ONE_SIDED_CONFIG, role: 'consumer', mode: 'read', asyncRead: true };
  const peers = {
    checkAllowed: () => undefined,
    metadataOf: () => null,
    statusFor: () => ({ state: 'ready', engineId: 'p' }),
    readyEngine: () => 'p',
    resolve: () => Promise.resolve('p'),
    forget: () => undefined,
  } as unknown as PeerDirectory;
  // The worker's READ consumer; the producer is hung: no READ lands, an abort is not acknowledged yet.
  const never = (): Promise<void> => new Promise<void>(() => undefined);
  const transfer = { wait: never, abort: never, notify: never };
  const { ctx, kv: kvConfig } = readContext(env, peers, { config, numBlocks: READS_MAX + 200, transfer });
  const connector = new OneSidedConnectorScheduler(config, kvConfig, env, { engineId: 'd', host: 'h', port: 1 }, null);
  const kv = new KVCacheManager(kvConfig, { enableCaching: false });
  const scheduler = new Scheduler(DEFAULT_SCHEDULER_CONFIG, kv, connector, env);
  const reads = new ReadConsumer(ctx);
  const step = async (): Promise<void> => {
    const so = scheduler.schedule();
    const meta = so.kvConnectorMetadata as OneSidedMetadata;
    for (const a of meta.abortedRecvs) reads.aborted(a.requestId);
    await reads.startLoadKv(meta.reqsToRecv, so.step); // an assertion here kills the engine loop
  };
  const decodeReq = (i: number) =>
    makeRequest(
      17,
      4,
      {
        do_remote_prefill: true,
        remote_engine_id: 'p',
        remote_host: '127.0.0.1',
        remote_port: 9,
        remote_block_ids: [[1, 2]],
        remote_num_tokens: 17,
        transfer_id: `t${i}`,
        grant: 'ab'.repeat(16),
      },
      `r${i}`,
      1 + i,
    );
  for (let i = 0; i < DEFAULT_SCHEDULER_CONFIG.maxWaiting; i++) scheduler.addRequest(decodeReq(i));
  await step();
  // A client leaves while its READ is in flight (its abort is not acknowledged yet); a new client comes.
  scheduler.abortRequest('r0');
  scheduler.addRequest(decodeReq(DEFAULT_SCHEDULER_CONFIG.maxWaiting));
  await step();
  await step();
  assert.ok(reads.numInFlight <= READS_MAX, `${reads.numInFlight} READs in the table`);
  assert.equal(scheduler.numWaiting, DEFAULT_SCHEDULER_CONFIG.maxWaiting, 'every live request still waits');
});
