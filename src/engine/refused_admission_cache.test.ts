/**
 * Decode side: a request refused at admission by the connector (its
 * kv_transfer_params fail the checks that need the handshake, e.g. remote_block_ids too short in
 * prefill's block size) computes nothing, so the page allocated for its last prompt token must not be
 * published. Before the fix, with pages of one token and a local hit on every token but the last,
 * allocateSlots published that page before the connector refused the request; its KV was never
 * computed (the page was not even zeroed), and the next request sharing the prompt hit it: one client's
 * bad params served another client stale KV.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import { KVCacheManager } from '../kv/kv_cache_manager.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import type { EngineMetadata } from '../transfer/core/types.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from '../connector/config.ts';
import { OneSidedConnectorScheduler } from '../connector/one_sided_scheduler.ts';
import type { PeerDirectory } from '../connector/peer_directory.ts';
import { DEFAULT_SCHEDULER_CONFIG, Scheduler } from './scheduler.ts';
import { fakeRun, makeRequest } from './scheduler_testkit.ts';

test('a request the connector refuses at admission publishes no page of its prompt', () => {
  const env = new SimEnv(3);
  let meta: EngineMetadata | null = null; // no handshake yet when the request is validated
  const peers = {
    checkAllowed: () => undefined,
    metadataOf: () => meta,
    statusFor: () => ({ state: 'ready', engineId: 'p' }),
  };
  const kvConfig = makeKVCacheConfig(presetKVGroups('llama-mini', 1), 256);
  const kv = new KVCacheManager(kvConfig, { enableCaching: true });
  const connector = new OneSidedConnectorScheduler(
    { ...DEFAULT_ONE_SIDED_CONFIG, role: 'consumer', mode: 'read' },
    kvConfig,
    env,
    { engineId: 'd', host: '127.0.0.1', port: 1 },
    null,
    0,
    peers as unknown as PeerDirectory,
  );
  const scheduler = new Scheduler(DEFAULT_SCHEDULER_CONFIG, kv, connector, env);
  const drive = () => {
    for (let k = 0; k < 20 && scheduler.hasWork(); k++) {
      const s = scheduler.schedule();
      scheduler.updateFromOutput(s, fakeRun(s));
    }
  };
  // A request computes the first 9 tokens of the prompt locally: they are cached.
  scheduler.addRequest(makeRequest(9, 1, null, 'warm', 500));
  drive();
  // The decode request (10 tokens) hits tokens 0-8, loads nothing (the last token is computed here).
  const bad = makeRequest(10, 2, null, 'bad', 500);
  bad.kvTransferParams = {
    do_remote_prefill: true,
    remote_engine_id: 'p',
    remote_host: '127.0.0.1',
    remote_port: 9,
    remote_block_ids: [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]], // 10 tokens in pages of 1: fine before the handshake
    transfer_id: 't',
    grant: 'ab'.repeat(16),
  };
  scheduler.addRequest(bad);
  meta = { engineId: 'p', layout: { blockSizes: [4] } } as EngineMetadata; // prefill pages by 4: the list claims 40 tokens
  const s = scheduler.schedule();
  assert.equal(bad.status, 'FINISHED_ERROR', 'refused at admission');
  assert.equal(s.numScheduledTokens['bad'], undefined, 'nothing of it is computed');
  scheduler.updateFromOutput(s, fakeRun(s));
  drive();
  const probe = [...bad.promptTokenIds, 7];
  const hit = kv.getComputedBlocks({ requestId: 'probe', tokenIds: probe }).numComputedTokens;
  assert.equal(
    hit,
    9,
    `a later prompt sharing it hits ${hit} tokens: the refused request's last token was never computed`,
  );
});
