/**
 * The seed's validation table, as our own tests: after updateStateAfterAlloc and buildConnectorMeta the
 * zeroing list is exactly what each zeroExclusion variant must give. `mamba-only` on the no-Mamba rows is
 * the seed's "main" column (READ destinations still zeroed: the bug); `all-read-groups` is "this PR".
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import { makeKVCacheConfig, type KVCacheGroupSpec } from '../kv/spec.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeEmptySchedulerOutput, type SchedulerOutput } from '../worker/scheduler_output.ts';
import type { OneSidedMetadata } from '../worker/connector_metadata.ts';
import { DEFAULT_ONE_SIDED_CONFIG, type OneSidedConfig } from './config.ts';
import { OneSidedConnectorScheduler, type GrantIssuer } from './one_sided_scheduler.ts';
import { excludeReadDestinations, ZERO_EXCLUSIONS, type ZeroExclusion } from './zero_exclusion.ts';
import type { ConnectorRequest } from './base.ts';

const BS = 128;
const attn: KVCacheGroupSpec = {
  groupId: 0,
  layerNames: ['l0.attn'],
  spec: { type: 'full_attention', blockSize: BS, numKvHeads: 1, headSize: 8, dtype: 'bf16', kvQuantMode: 'none' },
};
const mamba: KVCacheGroupSpec = {
  groupId: 1,
  layerNames: ['l1.mamba'],
  spec: { type: 'mamba', blockSize: BS, convDim: 8, convWidth: 3, ssmStateDim: 4, dtype: 'f32' },
};
const noGrants: GrantIssuer = {
  issueGrant: () => assert.fail('a consumer issues no grants'),
  revokeGrant: () => assert.fail('a consumer revokes no grants'),
};

/** What schedule() does with a connector: build the step's metadata, then exclude its READ destinations. */
function step(c: OneSidedConnectorScheduler, so: SchedulerOutput): OneSidedMetadata {
  const meta = c.buildConnectorMeta(so);
  so.newBlockIdsToZero = c.excludeReadDestinations(so.newBlockIdsToZero, meta);
  return meta;
}

function consumer(
  groups: KVCacheGroupSpec[],
  zeroExclusion: ZeroExclusion,
  extra: Partial<OneSidedConfig> = {},
): OneSidedConnectorScheduler {
  const cfg: OneSidedConfig = { ...DEFAULT_ONE_SIDED_CONFIG, role: 'consumer', mode: 'read', zeroExclusion, ...extra };
  return new OneSidedConnectorScheduler(
    cfg,
    makeKVCacheConfig(groups, 1024),
    new SimEnv(1),
    { engineId: 'd', host: '127.0.0.1', port: 1 },
    noGrants,
  );
}

function readRequest(numPromptTokens: number, remote: number[][]): ConnectorRequest {
  return {
    requestId: 'r1',
    numPromptTokens,
    numTokens: numPromptTokens,
    status: 'WAITING',
    kvTransferParams: {
      do_remote_prefill: true,
      remote_engine_id: 'p',
      remote_host: '127.0.0.1',
      remote_port: 9,
      remote_block_ids: remote,
      transfer_id: 't1',
      grant: 'ab'.repeat(16),
    },
  };
}

function expected(
  variant: ZeroExclusion,
  hasMamba: boolean,
  external: number,
  zeroIds: number[] | null,
): number[] | null {
  const excludes =
    external > 0 &&
    zeroIds !== null &&
    zeroIds.length > 0 &&
    (variant === 'all-read-groups' || (variant === 'mamba-only' && hasMamba));
  return excludes ? (zeroIds as number[]).slice(1) : zeroIds;
}

for (const variant of ZERO_EXCLUSIONS) {
  for (const external of [0, 256]) {
    for (const hasMamba of [false, true]) {
      for (const zeroIds of [null, [], [101], [101, 102, 202, 999]] as Array<number[] | null>) {
        test(`grid ${variant}: external=${external} mamba=${hasMamba} zero=${JSON.stringify(zeroIds)} → READ destinations removed only where the variant says`, () => {
          const c = consumer(hasMamba ? [attn, mamba] : [attn], variant);
          const remote = hasMamba ? [[10, 11], [91]] : [[10, 11]];
          const local = hasMamba
            ? [
                [100, 101, 102],
                [200, 201, 202],
              ]
            : [[100, 101, 102]];
          const req = readRequest(257, remote);
          c.validateRequest(req);
          // external 0 = a full local prefix hit of the 256 tokens prefill would have sent.
          const m = c.getNumNewMatchedTokens(req, 256 - external);
          assert.deepEqual(m, { numExternalTokens: external, loadAsync: false });
          c.updateStateAfterAlloc(req, local, external);
          const so = makeEmptySchedulerOutput(1);
          so.newBlockIdsToZero = zeroIds === null ? null : [...zeroIds];
          const before = JSON.parse(JSON.stringify({ ...so, newBlockIdsToZero: null }));
          const untouched = JSON.stringify(so);
          const meta = c.buildConnectorMeta(so);
          assert.equal(JSON.stringify(so), untouched, 'buildConnectorMeta changes nothing in the scheduler output');
          so.newBlockIdsToZero = c.excludeReadDestinations(so.newBlockIdsToZero, meta);
          const recv = meta.reqsToRecv[0];
          assert.ok(recv, 'the request is in this step’s receive set');
          const expectedLocal =
            external > 0 ? (hasMamba ? [[100, 101], [202]] : [[100, 101]]) : hasMamba ? [[], []] : [[]];
          assert.deepEqual(
            recv.localBlockIds,
            expectedLocal,
            'aligned destinations: tail 102 dropped, Mamba keeps its running slot',
          );
          if (external > 0) assert.deepEqual(recv.remoteBlockIds, remote);
          assert.deepEqual(so.newBlockIdsToZero, expected(variant, hasMamba, external, zeroIds));
          assert.deepEqual(
            { ...so, newBlockIdsToZero: null, kvConnectorMetadata: null },
            before,
            'no other field of the output changes',
          );
          // The receive set is per step: a second build leaves a new list alone.
          const so2 = makeEmptySchedulerOutput(2);
          so2.newBlockIdsToZero = [100, 101, 102];
          assert.equal(step(c, so2).reqsToRecv.length, 0);
          assert.deepEqual(so2.newBlockIdsToZero, [100, 101, 102]);
        });
      }
    }
  }
}

test('attention-only READ with two groups (fp8 MLA + f32 compressor): every group’s destinations removed, the recompute tail stays', () => {
  const groups = presetKVGroups('dsv4-mini');
  for (const variant of ZERO_EXCLUSIONS) {
    const c = consumer(groups, variant);
    const req = readRequest(33, [
      [10, 11],
      [20, 21],
    ]); // 32 tokens remote = 2 pages of 16
    c.updateStateAfterAlloc(
      req,
      [
        [100, 101, 102],
        [200, 201, 202],
      ],
      32,
    );
    const so = makeEmptySchedulerOutput(1);
    so.newBlockIdsToZero = [100, 101, 102, 200, 201, 202];
    step(c, so);
    const want = variant === 'all-read-groups' ? [102, 202] : [100, 101, 102, 200, 201, 202];
    assert.deepEqual(so.newBlockIdsToZero, want, variant);
  }
});

test('gates: WRITE mode, an empty receive set and a producer leave the zero list untouched', () => {
  const list = [5, 6, 7];
  const ctx = { readMode: false, hasMamba: false, numAttnGroups: 1 };
  assert.equal(excludeReadDestinations(list, 'all-read-groups', ctx, [[[5, 6]]]), list, 'WRITE mode');
  assert.equal(
    excludeReadDestinations(list, 'all-read-groups', { ...ctx, readMode: true }, []),
    list,
    'no receiving request',
  );
  const empty: number[] = [];
  assert.equal(
    excludeReadDestinations(empty, 'all-read-groups', { ...ctx, readMode: true }, [[[5]]]),
    empty,
    '[] stays [] (not null)',
  );
  assert.equal(excludeReadDestinations(null, 'all-read-groups', { ...ctx, readMode: true }, [[[5]]]), null);
  const w = consumer(presetKVGroups('llama-mini'), 'all-read-groups', { mode: 'write' });
  const req = readRequest(33, [[10, 11]]);
  w.updateStateAfterAlloc(req, [[100, 101, 102]], 33);
  const so = makeEmptySchedulerOutput(1);
  so.newBlockIdsToZero = [100, 101, 102];
  const meta = step(w, so);
  assert.deepEqual(
    so.newBlockIdsToZero,
    [100, 101, 102],
    'WRITE destinations are exempted by the scheduler skip set, not the connector',
  );
  assert.equal(meta.reqsToNotify.length, 1);
});

test('duplicates and order of the kept ids are preserved; removal can leave []', () => {
  const ctx = { readMode: true, hasMamba: false, numAttnGroups: 1 };
  assert.deepEqual(excludeReadDestinations([3, 1, 3, 2, 1], 'all-read-groups', ctx, [[[2]]]), [3, 1, 3, 1]);
  assert.deepEqual(excludeReadDestinations([2, 2], 'all-read-groups', ctx, [[[2]]]), []);
});

test('READ after a local prefix hit: the hit pages are never READ destinations; the rest pairs with the remote suffix', () => {
  const c = consumer(presetKVGroups('dsv4-mini'), 'all-read-groups');
  const req = readRequest(40, [
    [10, 11, 12],
    [20, 21, 22],
  ]);
  const m = c.getNumNewMatchedTokens(req, 16); // one page (16 tokens) hit locally
  assert.equal(m.numExternalTokens, 23);
  c.updateStateAfterAlloc(
    req,
    [
      [100, 101, 102],
      [200, 201, 202],
    ],
    23,
  );
  const so = makeEmptySchedulerOutput(1);
  so.newBlockIdsToZero = [101, 102, 201, 202]; // hit pages 100/200 are not new, so not listed
  const meta = step(c, so);
  assert.deepEqual(meta.reqsToRecv[0]?.localBlockIds, [
    [101, 102],
    [201, 202],
  ]);
  assert.deepEqual(meta.reqsToRecv[0]?.remoteBlockIds, [
    [11, 12],
    [21, 22],
  ]);
  assert.deepEqual(so.newBlockIdsToZero, []);
});

test('READ after a local prefix hit with a lookahead tail: pages pair by position, the hit is skipped, the tail stays zeroed', () => {
  const cfg = { ...DEFAULT_ONE_SIDED_CONFIG, role: 'consumer' as const, mode: 'read' as const };
  const c = new OneSidedConnectorScheduler(
    cfg,
    makeKVCacheConfig(presetKVGroups('dsv4-mini'), 1024),
    new SimEnv(1),
    { engineId: 'd', host: 'h', port: 1 },
    noGrants,
    2,
  );
  const req = readRequest(47, [
    [30, 31, 32],
    [40, 41, 42],
  ]); // prefill computed 47 tokens: 3 pages per group
  assert.equal(c.getNumNewMatchedTokens(req, 32).numExternalTokens, 14); // two pages hit locally
  c.updateStateAfterAlloc(
    req,
    [
      [1, 2, 15, 16],
      [4, 5, 17, 18],
    ],
    14,
  ); // decode: 47 tokens + 2 lookahead = 4 pages
  const so = makeEmptySchedulerOutput(1);
  so.newBlockIdsToZero = [15, 16, 17, 18];
  const meta = step(c, so);
  assert.deepEqual(meta.reqsToRecv[0]?.localBlockIds, [[15], [17]]);
  assert.deepEqual(meta.reqsToRecv[0]?.remoteBlockIds, [[32], [42]], 'page 2 receives remote page 2');
  assert.deepEqual(so.newBlockIdsToZero, [16, 18], 'the lookahead tail is zeroed');
});
