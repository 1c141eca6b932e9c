/**
 * Proves that the empty READ queued to release a refused request's producer (releaseUnused) cannot replace
 * a live request's READ of the same step. It was keyed `unused:<transfer_id>`, a valid X-Request-Id: a live
 * READ request whose id is `unused:t`, followed in the same step by a refused request naming transfer t,
 * lost its READ while its destinations stayed excluded from zeroing (they were looked up under the same
 * key): its forward ran over pages neither read nor zeroed (stale bytes, NaN). Two refused requests naming
 * one transfer id at two producers also kept only the last release (the other producer held its pages to
 * the end of its lease).
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
import type { PeerDirectory } from './peer_directory.ts';

function consumer(): OneSidedConnectorScheduler {
  const meta = { engineId: 'p', layout: { blockSizes: [32, 32] } } as unknown as EngineMetadata;
  const peers = {
    checkAllowed: () => undefined,
    metadataOf: () => meta,
    statusFor: () => ({ state: 'ready', engineId: 'p' }),
  };
  return new OneSidedConnectorScheduler(
    { ...DEFAULT_ONE_SIDED_CONFIG, role: 'consumer', mode: 'read', zeroExclusion: 'all-read-groups' },
    makeKVCacheConfig(presetKVGroups('dsv4-mini', 32), 256),
    new SimEnv(1),
    { engineId: 'd', host: '127.0.0.1', port: 1 },
    null,
    0,
    peers as unknown as PeerDirectory,
  );
}

function request(requestId: string, engine = 'p', port = 9): ConnectorRequest {
  return {
    requestId,
    numPromptTokens: 40,
    numTokens: 40,
    status: 'WAITING',
    kvTransferParams: {
      do_remote_prefill: true,
      remote_engine_id: engine,
      remote_host: '127.0.0.1',
      remote_port: port,
      remote_block_ids: [
        [1, 2],
        [11, 12],
      ],
      transfer_id: 't',
      grant: 'ab'.repeat(16),
    },
  };
}

test('a refused request’s release does not replace a live READ whose request id is unused:<transfer_id>', () => {
  const c = consumer();
  const live = request('unused:t');
  c.validateRequest(live);
  const pages = [
    [100, 101],
    [200, 201],
  ];
  c.updateStateAfterAlloc(live, pages, 39);
  // Same step: another request naming transfer t is refused (aborted before its pages): its producer is released.
  assert.equal(c.releaseUnused(request('other')), true);
  const meta = c.buildConnectorMeta({} as never);
  const liveRead = meta.reqsToRecv.find((r) => r.localBlockIds.some((g) => g.length > 0));
  assert.deepEqual(liveRead?.localBlockIds, pages, 'the live request still READs its pages this step');
  assert.equal(liveRead?.requestId, 'unused:t');
  assert.equal(meta.reqsToRecv.length, 2, 'and the refused one still releases its producer');
  // Its pages are excluded from zeroing only because they are READ.
  const zero = c.excludeReadDestinations([100, 101, 200, 201, 300], meta);
  assert.deepEqual(zero, [300]);
});

test('two refused requests naming one transfer id at two producers release both producers', () => {
  const c = consumer();
  assert.equal(c.releaseUnused(request('a', 'p', 9)), true);
  assert.equal(c.releaseUnused(request('b', 'q', 10)), true);
  const meta = c.buildConnectorMeta({} as never);
  assert.deepEqual(meta.reqsToRecv.map((r) => `${r.remoteEngineId}:${r.remotePort}`).sort(), ['p:9', 'q:10']);
});
