/**
 * Proves the READ plan in token space when prefill and decode page by different sizes (issue 14): which
 * decode pages are destinations and which prefill pages are sources, in both directions, with decode's
 * prefix hit and recompute tail; a Mamba state moves whole; prefill's page lists are checked in its own
 * block size (remote_block_size), and a claim the handshake contradicts is refused.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import { isHandoffError } from '../util/errors.ts';
import { mutationsFor } from '../util/mutants.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import type { EngineMetadata } from '../transfer/core/types.ts';
import { alignTokens } from './alignment.ts';
import type { ConnectorRequest } from './base.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from './config.ts';
import { OneSidedConnectorScheduler } from './one_sided_scheduler.ts';
import type { PeerDirectory } from './peer_directory.ts';
import { checkRemoteBlocks, planRead } from './read_plan.ts';

const badParams = (re: RegExp) => (e: unknown) =>
  isHandoffError(e) && e.code === 'BAD_TRANSFER_PARAMS' && re.test(e.message);

test('decode 32 / prefill 8: one decode page receives four prefill pages; coverage ends where prefill pages end', () => {
  // 20 prompt tokens: prefill holds 3 pages of 8 (24 tokens); decode 1 page of 32 (+ a lookahead tail page).
  const a = alignTokens({ blockIds: [100, 101], blockSize: 32 }, { blockIds: [1, 2, 3], blockSize: 8 }, 0, 1);
  assert.deepEqual(a, { local: [100], remote: [1, 2, 3], start: 0, end: 24 });
});

test('decode 8 / prefill 32: four decode pages receive one prefill page; decode hit of 8 tokens starts mid prefill page', () => {
  const a = alignTokens({ blockIds: [100, 101, 102, 103], blockSize: 8 }, { blockIds: [1], blockSize: 32 }, 8, 1);
  assert.deepEqual(a, { local: [101, 102, 103], remote: [1], start: 8, end: 32 });
  assert.throws(
    () =>
      alignTokens({ blockIds: [100, 101, 102, 103, 104, 105], blockSize: 8 }, { blockIds: [1], blockSize: 32 }, 0, 1),
    badParams(/beyond the allowed local tail \(6 local pages of 8 tokens, 1 remote of 32, allowed tail 1\)/),
  );
});

test('a plan per group: attention in tokens, the Mamba state page whole', () => {
  const plan = planRead({
    local: [[100, 101], [200]],
    remote: [[1, 2, 3, 4], [9]],
    numAttnGroups: 1,
    localBlockSize: 32,
    remoteBlockSize: 8,
    startToken: 0,
    maxTailBlocks: 1,
    mutations: mutationsFor(undefined),
  });
  assert.deepEqual(plan, {
    localBlockIds: [[100], [200]],
    remoteBlockIds: [[1, 2, 3, 4], [9]],
    tokenRuns: [
      [0, 32],
      [0, 0],
    ],
  });
});

test('prefill page lists are checked in prefill block size: 40 tokens need 5 pages of 8, not 2 of 32', () => {
  checkRemoteBlocks([[1, 2, 3, 4, 5]], 40, 1, 8);
  assert.throws(
    () => checkRemoteBlocks([[1, 2, 3, 4, 5]], 40, 1, 32),
    badParams(/has 5 blocks, the prompt needs at most 2/),
  );
  assert.throws(() => checkRemoteBlocks([[1, 2, 3]], 40, 1, 8), badParams(/has 3 blocks, the prompt needs 5/));
});

function consumer(peerBlockSize: number | null): OneSidedConnectorScheduler {
  const meta =
    peerBlockSize === null
      ? null
      : ({ engineId: 'p', layout: { blockSizes: [peerBlockSize, peerBlockSize] } } as EngineMetadata);
  const peers = {
    checkAllowed: () => undefined,
    metadataOf: () => meta,
    statusFor: () => ({ state: 'ready', engineId: 'p' }),
  };
  return new OneSidedConnectorScheduler(
    { ...DEFAULT_ONE_SIDED_CONFIG, role: 'consumer', mode: 'read' },
    makeKVCacheConfig(presetKVGroups('dsv4-mini', 32), 256),
    new SimEnv(1),
    { engineId: 'd', host: '127.0.0.1', port: 1 },
    null,
    0,
    peers as unknown as PeerDirectory,
  );
}

function request(remoteBlockSize: number | undefined): ConnectorRequest {
  return {
    requestId: 'r',
    numPromptTokens: 40,
    numTokens: 40,
    status: 'WAITING',
    kvTransferParams: {
      do_remote_prefill: true,
      remote_engine_id: 'p',
      remote_host: '127.0.0.1',
      remote_port: 9,
      remote_block_ids: [
        [1, 2, 3, 4, 5],
        [11, 12, 13, 14, 15],
      ],
      transfer_id: 't',
      grant: 'ab'.repeat(16),
      ...(remoteBlockSize !== undefined ? { remote_block_size: remoteBlockSize } : {}),
    },
  };
}

test('decode (32) admits prefill pages of 8 named by remote_block_size or the handshake; plans 40 tokens into 2 pages', () => {
  for (const [peer, claim] of [
    [null, 8],
    [8, undefined],
    [8, 8],
  ] as const) {
    const c = consumer(peer);
    const req = request(claim);
    c.validateRequest(req);
    c.updateStateAfterAlloc(
      req,
      [
        [100, 101],
        [200, 201],
      ],
      39,
    );
    const recv = c.buildConnectorMeta({} as never).reqsToRecv[0];
    assert.deepEqual(
      { local: recv?.localBlockIds, runs: recv?.tokenRuns, bs: recv?.remoteBlockSize },
      {
        local: [
          [100, 101],
          [200, 201],
        ],
        runs: [
          [0, 40],
          [0, 40],
        ],
        bs: 8,
      },
      `handshake ${peer}, claim ${claim}`,
    );
  }
});

test('a remote_block_size the handshake contradicts is refused before admission (400, naming the field)', () => {
  assert.throws(
    () => consumer(16).validateRequest(request(8)),
    badParams(/remote_block_size 8 does not match the producer's handshake \(16 tokens per page\)/),
  );
});

test('a plan that cannot be made (decode tail beyond the allowed one) leaves the transfer to release: the producer gets its pages back at once', () => {
  const c = consumer(8);
  const req = request(8);
  c.validateRequest(req);
  assert.throws(
    () =>
      c.updateStateAfterAlloc(
        req,
        [
          [100, 101, 102, 103],
          [200, 201, 202, 203],
        ],
        39,
      ),
    badParams(/beyond the allowed local tail/),
  );
  assert.equal(req.kvTransferParams?.do_remote_prefill, true, 'the request still owns its transfer');
  assert.equal(c.releaseUnused(req), true, 'refused: an empty READ releases the producer');
  const recv = c.buildConnectorMeta({} as never).reqsToRecv;
  assert.deepEqual(
    recv.map((r) => [r.transferId, r.localBlockIds]),
    [['t', [[], []]]],
  );
});
