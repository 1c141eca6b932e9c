/**
 * Decode in WRITE mode: a load whose producer could not be told where to write (its engine gone or unknown
 * at the step: readyEngine threw) stays `granted` with no grant issued until the step's collect fails it.
 * A write_done for it then ends no live grant, so the transfer layer checks nothing and passes it on
 * (grantEnded false), and WriteConsumer.writeDone took any such notice for a `granted` load as proof:
 * any handshaken peer that learned the transfer id marked the load done, and decode ran the request on
 * pages nobody wrote (zeros: wrong tokens, no error). The same holds for a grant that expired before the
 * collect that would have failed its load. Proves: a write_done without the grant's token completes no
 * load (it fails as it would have), like an aborted load's (write_done_forged.test.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import type { Device } from '../device/types.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import type { Notification, TransferEngine } from '../transfer/core/types.ts';
import { emptyOneSidedMetadata } from '../worker/connector_metadata.ts';
import { makeEmptySchedulerOutput } from '../worker/scheduler_output.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from './config.ts';
import { OneSidedConnectorWorker } from './one_sided_worker.ts';
import type { PeerDirectory } from './peer_directory.ts';

const tick = () => new Promise((r) => setImmediate(r));

test('WRITE consumer: a write_done for a load with no live grant does not complete it', async () => {
  const kv = makeKVCacheConfig(presetKVGroups('llama-mini', 16), 64);
  type Handler = (from: string, n: Notification, grantEnded: boolean) => void;
  const h: { handler: Handler | null } = { handler: null };
  const transfer = {
    onNotification: (f: Handler) => ((h.handler = f), () => undefined),
    peerMetadata: () => ({}),
    issueGrant: () => assert.fail('no grant: the producer is unknown'),
    revokeGrant: () => false,
    drainGrant: () => Promise.resolve(),
    notify: () => Promise.resolve(),
  };
  const peers = {
    readyEngine: () => {
      throw new HandoffError('PEER_UNAVAILABLE', 'prefill-0 is gone: 127.0.0.1:5 is prefill-1 now');
    },
    forget: () => undefined,
  };
  const worker = new OneSidedConnectorWorker(
    { ...DEFAULT_ONE_SIDED_CONFIG, role: 'consumer', mode: 'write' },
    kv,
    transfer as unknown as TransferEngine,
    {} as Device,
    kv.groups.map((g) => g.groupId),
    new SimEnv(1),
    peers as unknown as PeerDirectory,
  );
  const so = makeEmptySchedulerOutput(1);
  so.kvConnectorMetadata = emptyOneSidedMetadata();
  so.kvConnectorMetadata.reqsToNotify = [
    {
      requestId: 'D',
      transferId: 'T',
      localBlockIds: [[4, 5, 6]],
      skipBlocks: 0,
      endToken: 48,
      remoteEngineId: 'prefill-0',
      remoteHost: '127.0.0.1',
      remotePort: 5,
    },
  ];
  await worker.preForward(so);
  // While the step's forward runs, a peer names T: no grant lives under it, so nothing was checked.
  h.handler?.('mallory', { type: 'write_done', transferId: 'T', payload: { grant: 'ff'.repeat(16) } }, false);
  const out = await worker.postForward(so);
  assert.deepEqual(out.finishedRecving, [], 'the load was reported loaded: decode runs on pages nobody wrote');
  await tick();
  const so2 = makeEmptySchedulerOutput(2);
  so2.kvConnectorMetadata = emptyOneSidedMetadata();
  await worker.preForward(so2);
  const out2 = await worker.postForward(so2);
  assert.deepEqual(out2.failedLoadReqIds, ['D'], 'the load fails: nobody was told where to write');
});
