/**
 * Prefill in WRITE mode, a decode's destination near or after the end of the lease: the save is given up
 * (its pages go back to the pool), so nothing will be pushed. Before, prefill said nothing and decode
 * waited its whole transfer deadline (30 s by default) before recomputing. Proves: prefill answers such a
 * destination with `write_refused` (carrying decode's grant token, so decode knows it is the grant's peer),
 * whether it came before the lease end reached the worker or after; and decode's WriteConsumer fails the
 * load at its next collect, past the grant's drain, without waiting for the deadline.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import type { Device } from '../device/types.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import type { Notification, TransferEngine } from '../transfer/core/types.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from './config.ts';
import { OneSidedConnectorWorker } from './one_sided_worker.ts';
import type { PeerDirectory } from './peer_directory.ts';
import { writeProducerRig } from './write_producer_testkit.ts';
import { emptyOneSidedMetadata } from '../worker/connector_metadata.ts';
import { makeEmptySchedulerOutput } from '../worker/scheduler_output.ts';

const tick = () => new Promise((r) => setImmediate(r));

async function heldSave(rig: ReturnType<typeof writeProducerRig>) {
  const so1 = rig.step(1, (m) => {
    m.sendTransfers = { T: 'R' };
    m.reqsToSave = [{ requestId: 'R', transferId: 'T', localBlockIds: [[1, 2, 3]] }];
  });
  await rig.worker.preForward(so1);
  await rig.worker.postForward(so1);
}

const refusals = (rig: ReturnType<typeof writeProducerRig>) =>
  rig.h.notified.filter((n) => n.type === 'write_refused').map((n) => [n.to, n.transferId, n.payload?.['grant']]);

test('WRITE producer: a destination that comes after the lease ended is refused at once', async () => {
  const rig = writeProducerRig();
  await heldSave(rig);
  const so2 = rig.step(2, (m) => (m.expiring = { T: 'R' }));
  await rig.worker.preForward(so2);
  assert.deepEqual((await rig.worker.postForward(so2)).finishedSending, ['R'], 'the lease end frees R');
  rig.destination();
  await tick();
  assert.deepEqual(rig.h.posted, [], 'nothing pushed from freed pages');
  assert.deepEqual(refusals(rig), [['decode-0', 'T', 'cd'.repeat(16)]], 'decode is told no push will come');
});

test('WRITE producer: a destination that came while the lease end was on its way to the worker is refused', async () => {
  const rig = writeProducerRig();
  await heldSave(rig);
  rig.destination(); // during step 1's forward; step 2's metadata already says the lease ended
  const so2 = rig.step(2, (m) => (m.expiring = { T: 'R' }));
  await rig.worker.preForward(so2);
  await tick();
  const out = await rig.worker.postForward(so2);
  assert.deepEqual(rig.h.posted, [], 'the lease end reached the worker first: nothing pushed');
  assert.deepEqual(out.finishedSending, ['R']);
  assert.deepEqual(refusals(rig), [['decode-0', 'T', 'cd'.repeat(16)]], 'decode is told no push will come');
});

test('WRITE producer: a push that cannot be made (decode asked for more tokens than the pages hold) is refused', async () => {
  const rig = writeProducerRig();
  await heldSave(rig);
  rig.notify('decode-0', {
    type: 'remote_blocks',
    transferId: 'T',
    payload: { blockIds: [[7, 8, 9, 10]], skipBlocks: 0, endToken: 64, grant: 'cd'.repeat(16) },
  });
  const so2 = rig.step(2, (m) => (m.sendTransfers = { T: 'R' }));
  await rig.worker.preForward(so2);
  await tick();
  const out = await rig.worker.postForward(so2);
  assert.deepEqual(rig.h.posted, [], 'no WRITE posted');
  assert.deepEqual(out.finishedSending, ['R'], 'its pages are freed');
  assert.deepEqual(refusals(rig), [['decode-0', 'T', 'cd'.repeat(16)]], 'decode is told no push will come');
});

test('WRITE consumer: write_refused from the grant peer fails the load now, not at the deadline', async () => {
  const kv = makeKVCacheConfig(presetKVGroups('llama-mini', 16), 64);
  let handler: ((from: string, n: Notification, grantEnded: boolean) => void) | null = null;
  const transfer = {
    onNotification: (f: typeof handler) => ((handler = f), () => undefined),
    peerMetadata: () => ({}), // the producer is still connected
    issueGrant: () => ({ token: 'cd'.repeat(16), expiresAtMs: 1e9 }),
    revokeGrant: () => true,
    drainGrant: () => Promise.resolve(),
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
  const step = async (n: number) => {
    const so = makeEmptySchedulerOutput(n);
    so.kvConnectorMetadata = emptyOneSidedMetadata();
    if (n === 1) {
      const notice = { requestId: 'D', transferId: 'T', localBlockIds: [[4, 5, 6]], skipBlocks: 0, endToken: 48 };
      const where = { remoteEngineId: 'prefill-0', remoteHost: '127.0.0.1', remotePort: 5 };
      so.kvConnectorMetadata.reqsToNotify = [{ ...notice, ...where }];
    }
    await worker.preForward(so);
    return worker.postForward(so);
  };
  await step(1);
  // A refusal that ended no live grant (the transfer layer refuses a wrong token before this) changes nothing.
  handler!('prefill-0', { type: 'write_refused', transferId: 'T', payload: {} }, false);
  await tick();
  assert.deepEqual((await step(2)).failedLoadReqIds, [], 'a refusal that proved nothing is ignored');
  handler!('prefill-0', { type: 'write_refused', transferId: 'T', payload: { grant: 'cd'.repeat(16) } }, true);
  await tick();
  const out = await step(3);
  assert.deepEqual(out.failedLoadReqIds, ['D'], 'the load failed at once (its deadline is 30 s away)');
  assert.equal(out.loadErrors['D']?.code, 'KV_LOAD_FAILED');
  assert.deepEqual(out.invalidBlockIds, [4, 5, 6]);
});
