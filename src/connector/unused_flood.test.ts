/**
 * Releases of unused loads (LLMEngine.releaseRefused and requests aborted before admission, both through
 * OneSidedConnectorScheduler.releaseUnused) queue one empty READ per transfer, posted in the next step.
 * Nothing bounds them per step, but each one took an entry of the worker's READ table (READS_MAX 4096,
 * an assertion beyond) until the step's READs were awaited. While a step waits on a hung producer (up to
 * transfer_timeout_ms), a flood of refused submissions (queue full: OVERLOADED), or cancelling a full
 * queue while async READs hold entries, queues more than the table holds, and the worker's assertion kills
 * the engine loop. This proves it on the real connector scheduler and READ consumer: READS_MAX + 1 unused
 * releases in one step are all sent, and nothing throws.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import type { OneSidedMetadata } from '../worker/connector_metadata.ts';
import { DEFAULT_ONE_SIDED_CONFIG, type OneSidedConfig } from './config.ts';
import type { ConnectorRequest } from './base.ts';
import { OneSidedConnectorScheduler } from './one_sided_scheduler.ts';
import type { PeerDirectory } from './peer_directory.ts';
import { READS_MAX, ReadConsumer } from './read_consumer.ts';
import { readContext } from './read_consumer_testkit.ts';

test('more unused releases in one step than the READ table holds: all sent, no crash', async () => {
  const env = new SimEnv(5);
  const config: OneSidedConfig = { ...DEFAULT_ONE_SIDED_CONFIG, role: 'consumer', mode: 'read' };
  const peers = {
    readyEngine: () => 'p',
    resolve: () => Promise.resolve('p'),
    forget: () => undefined,
  } as unknown as PeerDirectory;
  const released: string[] = [];
  const notify = (_peer: string, n: { transferId: string }) => (released.push(n.transferId), Promise.resolve());
  const { ctx, kv: kvConfig } = readContext(env, peers, { config, transfer: { notify } });
  const connector = new OneSidedConnectorScheduler(config, kvConfig, env, { engineId: 'd', host: 'h', port: 1 }, null);
  const reads = new ReadConsumer(ctx);
  const n = READS_MAX + 1;
  for (let i = 0; i < n; i++) {
    const refused: ConnectorRequest = {
      requestId: `r${i}`,
      numPromptTokens: 17,
      numTokens: 17,
      status: 'FINISHED_ABORTED',
      kvTransferParams: {
        do_remote_prefill: true,
        remote_engine_id: 'p',
        remote_host: '127.0.0.1',
        remote_port: 9,
        remote_block_ids: [[1, 2]],
        transfer_id: `t${i}`,
        grant: 'ab'.repeat(16),
      },
    } as ConnectorRequest;
    assert.ok(connector.releaseUnused(refused));
  }
  const meta = connector.buildConnectorMeta({} as never) as OneSidedMetadata;
  assert.equal(meta.reqsToRecv.length, n, 'one empty READ per unused transfer, in one step');
  await reads.startLoadKv(meta.reqsToRecv, 1); // threw AssertionFailure: READ consumer: more than 4096 transfers
  const result = await reads.awaitReadsIssuedThisStep(1);
  assert.deepEqual(result.failedReqIds, []);
  for (let k = 0; k < 20 && released.length < n; k++) await new Promise((r) => setImmediate(r));
  assert.equal(released.length, n, 'every producer told to free its pages');
  assert.equal(reads.numInFlight, 0);
});
