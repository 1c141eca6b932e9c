/**
 * remote_block_ids are checked against the prompt at admission in the block size known THEN
 * (no handshake yet, no remote_block_size claim: decode's own); the plan later uses the handshake's size.
 * A list long enough in decode's size but too short in prefill's real size was planned silently: decode
 * READ fewer tokens than it counts as computed (numExternal), and computed on zeroed/stale KV.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import { isHandoffError } from '../util/errors.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import type { EngineMetadata } from '../transfer/core/types.ts';
import type { ConnectorRequest } from './base.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from './config.ts';
import { OneSidedConnectorScheduler } from './one_sided_scheduler.ts';
import type { PeerDirectory } from './peer_directory.ts';

test('remote_block_ids too short in the handshake block size are refused at plan time, not READ in part', () => {
  let meta: EngineMetadata | null = null; // no handshake yet when the request is validated
  const peers = {
    checkAllowed: () => undefined,
    metadataOf: () => meta,
    statusFor: () => ({ state: 'ready', engineId: 'p' }),
  };
  const c = new OneSidedConnectorScheduler(
    { ...DEFAULT_ONE_SIDED_CONFIG, role: 'consumer', mode: 'read' },
    makeKVCacheConfig(presetKVGroups('dsv4-mini', 32), 256),
    new SimEnv(1),
    { engineId: 'd', host: '127.0.0.1', port: 1 },
    null,
    0,
    peers as unknown as PeerDirectory,
  );
  const req: ConnectorRequest = {
    requestId: 'r',
    numPromptTokens: 40,
    numTokens: 40,
    status: 'WAITING',
    kvTransferParams: {
      do_remote_prefill: true,
      remote_engine_id: 'p',
      remote_host: '127.0.0.1',
      remote_port: 9,
      // 2 pages: enough for 40 tokens in pages of 32 (decode's size), only 16 tokens in prefill's pages of 8.
      remote_block_ids: [
        [1, 2],
        [11, 12],
      ],
      transfer_id: 't',
      grant: 'ab'.repeat(16),
    },
  };
  c.validateRequest(req); // passes in decode's size (the only one known)
  // The handshake completes: prefill pages by 8.
  meta = { engineId: 'p', layout: { blockSizes: [8, 8] } } as EngineMetadata;
  let planned: unknown = null;
  try {
    c.updateStateAfterAlloc(
      req,
      [
        [100, 101],
        [200, 201],
      ],
      39,
    );
    const recv = c.buildConnectorMeta({} as never).reqsToRecv[0];
    planned = recv?.tokenRuns;
  } catch (e) {
    assert.ok(isHandoffError(e) && e.code === 'BAD_TRANSFER_PARAMS', String(e));
    assert.equal(req.kvTransferParams?.do_remote_prefill, true, 'refused: the transfer is left to release');
    return;
  }
  assert.fail(`39 tokens counted as loaded, but the READ moves only tokens ${JSON.stringify(planned)}`);
});
