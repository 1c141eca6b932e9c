/**
 * Decode in WRITE mode, a load aborted while the producer may still be writing: its grant is revoked and
 * its pages are released once the grant's drain settled (a WRITE under way may land until then), or
 * earlier at the producer's write_done (sent once its WRITE landed whole). With the grant revoked, the
 * transfer layer checks nothing and passes on anyone's write_done (grantEnded false). Before, any such
 * notice released the pages at once: a handshaken peer that learned the transfer id could hand them back
 * to the pool while prefill's WRITE was still landing in them (another request's KV overwritten). Proves:
 * a write_done without the grant's token releases nothing (the drain still does); one with it still
 * releases early.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
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

/** Decode granted T to prefill-0 for request D, then D was aborted: the grant revoked, its drain pending. */
async function abortedLoad() {
  const kv = makeKVCacheConfig(presetKVGroups('llama-mini', 16), 64);
  type Handler = (from: string, n: Notification, grantEnded: boolean) => void;
  const h: { handler: Handler | null; settleDrain: (() => void) | null } = { handler: null, settleDrain: null };
  const transfer = {
    onNotification: (f: Handler) => ((h.handler = f), () => undefined),
    peerMetadata: () => ({}), // the producer is still connected
    issueGrant: () => ({ token: 'cd'.repeat(16), expiresAtMs: 1e9 }),
    revokeGrant: () => true,
    drainGrant: () => new Promise<void>((resolve) => (h.settleDrain = resolve)),
    notify: () => Promise.resolve(),
  };
  const peers = { readyEngine: () => 'prefill-0', forget: () => undefined };
  const worker = new OneSidedConnectorWorker(
    { ...DEFAULT_ONE_SIDED_CONFIG, role: 'consumer', mode: 'write' },
    kv,
    transfer as unknown as TransferEngine,
    {} as Device,
    kv.groups.map((g) => g.groupId),
    new SimEnv(1),
    peers as unknown as PeerDirectory,
  );
  const step = async (n: number, fill: (m: ReturnType<typeof emptyOneSidedMetadata>) => void = () => {}) => {
    const so = makeEmptySchedulerOutput(n);
    so.kvConnectorMetadata = emptyOneSidedMetadata();
    fill(so.kvConnectorMetadata);
    await worker.preForward(so);
    return worker.postForward(so);
  };
  const where = { remoteEngineId: 'prefill-0', remoteHost: '127.0.0.1', remotePort: 5 };
  await step(1, (m) => {
    m.reqsToNotify = [
      { requestId: 'D', transferId: 'T', localBlockIds: [[4, 5, 6]], skipBlocks: 0, endToken: 48, ...where },
    ];
  });
  // The client leaves: the grant is revoked, the pages wait for the drain (prefill's WRITE may be landing).
  const out2 = await step(2, (m) => (m.abortedRecvs = [{ requestId: 'D', transferId: 'T' }]));
  assert.deepEqual(out2.finishedSending, []);
  assert.ok(h.settleDrain !== null, 'the abort drains the grant');
  return { h, step };
}

test('WRITE consumer: a write_done after the abort revoked the grant does not release pages before the drain', async () => {
  const { h, step } = await abortedLoad();
  // A write_done for T now ended no grant (the abort revoked it): it proves nothing.
  h.handler?.('mallory', { type: 'write_done', transferId: 'T', payload: { grant: 'ff'.repeat(16) } }, false);
  await tick();
  const out3 = await step(3);
  assert.deepEqual(out3.finishedSending, [], "D's pages released while a WRITE may still land in them");
  h.settleDrain?.();
  await tick();
  assert.deepEqual((await step(4)).finishedSending, ['D'], 'the drain releases them');
});

test("WRITE consumer: the producer's write_done (the grant's token) still releases an aborted load early", async () => {
  const r = await abortedLoad();
  r.h.handler?.('prefill-0', { type: 'write_done', transferId: 'T', payload: { grant: 'cd'.repeat(16) } }, false);
  await tick();
  assert.deepEqual((await r.step(3)).finishedSending, ['D'], 'the WRITE landed whole: released before the drain');
});
