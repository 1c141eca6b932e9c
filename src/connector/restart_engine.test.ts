/**
 * A prefill restarted on the same address (compatible, a new engine id) while decode had requests queued
 * with the old prefill's params: their READ met the new engine and failed BAD_TRANSFER_PARAMS ("peer at
 * host:port is prefill-new, not prefill-old"), a client fault (400) although the proxy made those params
 * from a prefill that really existed. This proves an engine this decode once handshook, now replaced, is a
 * peer gone (PEER_UNAVAILABLE: recompute or fail by kvLoadFailurePolicy), while an engine id never seen at
 * any address stays BAD_TRANSFER_PARAMS. The same when the process now at that address refuses the
 * handshake as incompatible (restarted with another model or layout): the READ failed PEER_INCOMPATIBLE,
 * which step_failures.ts counts as a client fault (409), for params that were right when the proxy made them.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import type { EngineMetadata } from '../transfer/core/types.ts';
import type { RecvReqMeta } from '../worker/connector_metadata.ts';
import { PeerDirectory } from './peer_directory.ts';
import { ReadConsumer } from './read_consumer.ts';
import { flush, HOST, PORT, readContext } from './read_consumer_testkit.ts';

/** How the address answers a handshake after the restart. */
type Restart = 'compatible' | 'incompatible';

async function rig(restart: Restart = 'compatible') {
  const env = new SimEnv(1);
  let engineId = 'prefill-old';
  const incompatible = new HandoffError('PEER_INCOMPATIBLE', 'model mismatch: llama-mini vs dsv4-mini');
  const peers = new PeerDirectory(
    () =>
      engineId === 'prefill-new' && restart === 'incompatible'
        ? Promise.reject(incompatible)
        : Promise.resolve({ engineId } as unknown as EngineMetadata),
    env,
  );
  const { ctx, posted } = readContext(env, peers);
  // The old prefill is handshaken (it served this decode), then restarts: a new engine at the same address.
  peers.statusFor(HOST, PORT, 'prefill-old');
  await flush();
  engineId = 'prefill-new';
  if (restart === 'compatible') {
    peers.statusFor(HOST, PORT, 'prefill-new');
    await flush();
    assert.deepEqual(peers.peek(HOST, PORT), { state: 'ready', engineId: 'prefill-new' });
  } else {
    // The side channel to the old one was lost (forget); the queued request's peer handshakes again.
    peers.forget(HOST, PORT);
    peers.statusFor(HOST, PORT, 'prefill-old');
    await flush();
    assert.equal(peers.peek(HOST, PORT)?.state, 'failed');
  }
  return { reads: new ReadConsumer(ctx), posted };
}

const recv = (remoteEngineId: string): RecvReqMeta => ({
  requestId: `r-${remoteEngineId}`,
  transferId: `x-${remoteEngineId}`,
  localBlockIds: [[1], [2]],
  remoteBlockIds: [[1], [2]],
  tokenRuns: [[0, 16]],
  remoteBlockSize: 16,
  remoteEngineId,
  remoteHost: HOST,
  remotePort: PORT,
  grant: 'ab'.repeat(16),
});

async function loadError(remoteEngineId: string, restart?: Restart): Promise<{ code: string; posted: string[] }> {
  const { reads, posted } = await rig(restart);
  await reads.startLoadKv([recv(remoteEngineId)], 1);
  const result = await reads.awaitReadsIssuedThisStep(1);
  assert.deepEqual(result.failedReqIds, [`r-${remoteEngineId}`]);
  return { code: result.loadErrors[`r-${remoteEngineId}`]?.code ?? 'none', posted };
}

test('a READ queued for a prefill that restarted (same address, new engine id) is a peer gone, not bad params', async () => {
  const { code, posted } = await loadError('prefill-old');
  assert.equal(code, 'PEER_UNAVAILABLE', 'transient: recomputed by kvLoadFailurePolicy, not a 400');
  assert.deepEqual(posted, [], 'nothing READ from the new engine');
});

test('an engine id never handshaken at any address is still the params’ fault (BAD_TRANSFER_PARAMS)', async () => {
  const { code, posted } = await loadError('prefill-000000000000');
  assert.equal(code, 'BAD_TRANSFER_PARAMS');
  assert.deepEqual(posted, []);
});

test('a READ queued for a prefill replaced by an incompatible one is a peer gone, not a 409 client fault', async () => {
  const { code, posted } = await loadError('prefill-old', 'incompatible');
  assert.equal(code, 'PEER_UNAVAILABLE', 'transient: recomputed by kvLoadFailurePolicy, not PEER_INCOMPATIBLE');
  assert.deepEqual(posted, []);
});
