/**
 * A prefill restarted on the same address with another block size (a new engine id): decode still holds
 * the old engine's handshake. Admission compared the new params' remote_block_size with that stale
 * handshake and refused the request with 400 BAD_TRANSFER_PARAMS, although the params were right and the
 * peer is only re-handshaken when the request asks for it (statusFor, after admission): a server-side
 * state problem reported as the client's fault. This proves the handshake of another engine is not taken
 * as the authority: the request is admitted, waits for the refreshed handshake, and plans its READ in the
 * new engine's block size; a claim that contradicts the same engine's handshake is still refused.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import type { EngineMetadata } from '../transfer/core/types.ts';
import type { ConnectorRequest } from './base.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from './config.ts';
import { OneSidedConnectorScheduler } from './one_sided_scheduler.ts';
import { PeerDirectory } from './peer_directory.ts';

const meta = (engineId: string, blockSize: number): EngineMetadata =>
  ({ engineId, layout: { blockSizes: [blockSize, blockSize] } }) as unknown as EngineMetadata;

function rig() {
  const env = new SimEnv(1);
  let answer = meta('prefill-old', 16);
  const peers = new PeerDirectory(() => Promise.resolve(answer), env);
  const c = new OneSidedConnectorScheduler(
    { ...DEFAULT_ONE_SIDED_CONFIG, role: 'consumer', mode: 'read' },
    makeKVCacheConfig(presetKVGroups('dsv4-mini', 16), 256),
    env,
    { engineId: 'd', host: '127.0.0.1', port: 1 },
    null,
    0,
    peers,
  );
  const restart = (m: EngineMetadata): void => void (answer = m);
  return { c, peers, restart };
}

const request = (engineId: string, blockSize: number, ids: number[][]): ConnectorRequest => ({
  requestId: `r-${engineId}-${blockSize}`,
  numPromptTokens: 60,
  numTokens: 60,
  status: 'WAITING',
  kvTransferParams: {
    do_remote_prefill: true,
    remote_engine_id: engineId,
    remote_host: '127.0.0.1',
    remote_port: 9,
    remote_block_ids: ids,
    remote_block_size: blockSize,
    transfer_id: `t-${engineId}`,
    grant: 'ab'.repeat(16),
  },
});

const settle = () => new Promise((r) => setImmediate(r));

test('params of a prefill restarted with another block size are admitted and planned in its new size', async () => {
  const { c, peers, restart } = rig();
  // The old prefill (pages of 16) was handshaken and served a request.
  assert.equal(peers.statusFor('127.0.0.1', 9, 'prefill-old').state, 'connecting');
  await settle();
  assert.equal(peers.statusFor('127.0.0.1', 9, 'prefill-old').state, 'ready');
  // It restarts on the same address, paging by 32: its params are right for the new engine.
  restart(meta('prefill-new', 32));
  const req = request('prefill-new', 32, [
    [1, 2],
    [11, 12],
  ]);
  c.validateRequest(req); // threw BAD_TRANSFER_PARAMS: "does not match the producer's handshake (16 ...)"
  assert.equal(c.getNumNewMatchedTokens(req, 0).numExternalTokens, null, 'waits for the refreshed handshake');
  await settle();
  const matched = c.getNumNewMatchedTokens(req, 0);
  assert.equal(matched.numExternalTokens, 59);
  c.updateStateAfterAlloc(
    req,
    [
      [100, 101, 102, 103],
      [200, 201, 202, 203],
    ],
    59,
  );
  const recv = c.buildConnectorMeta({} as never).reqsToRecv[0];
  assert.equal(recv?.remoteBlockSize, 32, 'planned in the new engine’s pages');
});

test('a remote_block_size that contradicts the same engine’s handshake is still refused (400)', async () => {
  const { c, peers } = rig();
  peers.statusFor('127.0.0.1', 9, 'prefill-old');
  await settle();
  const req = request('prefill-old', 32, [
    [1, 2],
    [11, 12],
  ]);
  assert.throws(
    () => c.validateRequest(req),
    (e: Error & { code?: string }) => e.code === 'BAD_TRANSFER_PARAMS',
  );
});
