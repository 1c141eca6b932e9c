/**
 * Scheduler tests: the READ-exclusion sequence through a real scheduler, async scheduling one step ahead,
 * deferred frees, producer hand-off with grants and leases, WRITE async loads, load-failure policies, and
 * property tests (no page owned twice, token accounting, every request ends, nothing leaks).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { HandoffError } from '../util/errors.ts';
import { DEFAULT_ONE_SIDED_CONFIG, type OneSidedConfig } from '../connector/config.ts';
import { OneSidedConnectorScheduler, type GrantIssuer } from '../connector/one_sided_scheduler.ts';
import type { KVTransferParams } from '../connector/params.ts';
import type { SimEnv } from '../util/env.ts';
import type { KVCacheManager } from '../kv/kv_cache_manager.ts';
import { fakeRun, makeRequest, makeScheduler } from './scheduler_testkit.ts';

const GRANT = 'cd'.repeat(16);

function oneSided(cfg: Partial<OneSidedConfig>, grants: GrantIssuer | null = null) {
  return (env: SimEnv, kv: KVCacheManager) =>
    new OneSidedConnectorScheduler(
      { ...DEFAULT_ONE_SIDED_CONFIG, ...cfg },
      kv.config,
      env,
      { engineId: 'e', host: '127.0.0.1', port: 7 },
      grants,
    );
}

function readParams(remote: number[][]): KVTransferParams {
  return {
    do_remote_prefill: true,
    remote_engine_id: 'prefill-0',
    remote_host: '127.0.0.1',
    remote_port: 5,
    remote_block_ids: remote,
    transfer_id: 'x1',
    grant: GRANT,
  };
}

test('sequence: READ destinations excluded at admission; after finish the same pages go to a local request and are zeroed', () => {
  // 7 blocks = null + 6: the READ request takes all six, so the next request must reuse them.
  const { scheduler, kv } = makeScheduler({ numBlocks: 7, connector: oneSided({ role: 'consumer', mode: 'read' }) });
  const a = makeRequest(
    33,
    1,
    readParams([
      [1, 2],
      [3, 4],
    ]),
  );
  scheduler.addRequest(a);
  const so1 = scheduler.schedule();
  const pages = kv.getBlockIds(a.requestId);
  assert.equal(so1.scheduledNewReqs[0]?.numComputedTokens, 32, 'N-1 tokens come from prefill');
  assert.equal(so1.numScheduledTokens[a.requestId], 1, 'decode recomputes the last prompt token');
  assert.equal(so1.hasSyncKvLoads, true);
  const tails = pages.map((g) => g[2]);
  assert.deepEqual(so1.newBlockIdsToZero, tails, 'only the recompute tail of each group is zeroed');
  scheduler.updateFromOutput(so1, fakeRun(so1));
  assert.equal(kv.getNumFreeBlocks(), 6, 'finished request’s pages freed once its step was processed');
  const b = makeRequest(33, 1);
  scheduler.addRequest(b);
  const so2 = scheduler.schedule();
  assert.deepEqual([...(so2.newBlockIdsToZero ?? [])].sort(), pages.flat().sort(), 'every reused page is zeroed again');
});

test('async scheduling: a decode step is scheduled before the previous output is seen; the fence defers frees', () => {
  const { scheduler, kv } = makeScheduler({ numBlocks: 32 });
  const r = makeRequest(20, 3);
  scheduler.addRequest(r);
  const s1 = scheduler.schedule();
  const s2 = scheduler.schedule(); // one step ahead: input is the token s1 samples
  assert.equal(s2.numScheduledTokens[r.requestId], 1);
  assert.deepEqual(s2.scheduledCachedReqs[0]?.newTokenIds, [], 'the input token is still on the device');
  assert.equal(r.numOutputPlaceholders, 2);
  scheduler.abortRequest(r.requestId);
  const held = kv.getNumFreeBlocks();
  scheduler.updateFromOutput(s1, fakeRun(s1));
  assert.equal(kv.getNumFreeBlocks(), held, 'pages stay out of the pool while step 2 may still write them');
  scheduler.updateFromOutput(s2, fakeRun(s2));
  assert.equal(kv.getNumFreeBlocks(), 31, 'freed once every step that could write them was processed');
  assert.ok(scheduler.isQuiescent());
});

test('producer: pages held and granted until release; a lease that runs out revokes the grant, frees them once the worker let go', () => {
  const issued: string[] = [];
  const revoked: string[] = [];
  const grants: GrantIssuer = {
    issueGrant: (g) => (issued.push(`${g.transferId}:${g.blockIds.join(',')}`), { token: GRANT, expiresAtMs: 99 }),
    revokeGrant: (t) => void revoked.push(t),
  };
  const { scheduler, kv, env } = makeScheduler({
    numBlocks: 16,
    connector: oneSided({ role: 'producer', leaseMs: 1000 }, grants),
  });
  const r = makeRequest(40, 1, { do_remote_decode: true, transfer_id: 'T1' });
  scheduler.addRequest(r);
  const so = scheduler.schedule();
  const outs = scheduler.updateFromOutput(so, fakeRun(so));
  const params = outs[0]?.kvTransferParams as Record<string, unknown>;
  assert.equal(outs[0]?.finishReason, 'length');
  assert.deepEqual(params['remote_block_ids'], so.scheduledNewReqs[0]?.blockIds, 'one list per transfer group');
  assert.equal(params['grant'], GRANT);
  assert.equal(issued.length, 1);
  assert.equal(kv.getNumFreeBlocks(), 15 - 6, 'held for the decode side');
  // Released by the decode side (the worker reports finishedSending).
  const r2 = makeRequest(40, 1, { do_remote_decode: true, transfer_id: 'T2' }, 'r2', 500);
  scheduler.addRequest(r2);
  const so2 = scheduler.schedule();
  scheduler.updateFromOutput(so2, fakeRun(so2, { finishedSending: [r.requestId] }));
  assert.equal(kv.getNumFreeBlocks(), 15 - 6, 'r freed, r2 now held');
  env.advanceTo(5000);
  const so3 = scheduler.schedule();
  scheduler.updateFromOutput(so3, fakeRun(so3));
  assert.deepEqual(revoked, ['T2'], 'lease ran out without a release: no new READ is served');
  assert.equal(kv.getNumFreeBlocks(), 15 - 6, 'a reply may still be going out from the pages');
  const so4 = scheduler.schedule();
  assert.deepEqual((so4.kvConnectorMetadata as { expiring: Record<string, string> }).expiring, { T2: r2.requestId });
  scheduler.updateFromOutput(so4, fakeRun(so4, { finishedSending: [r2.requestId] }));
  assert.equal(kv.getNumFreeBlocks(), 15, 'freed once the worker reported that the NIC let go');
  assert.ok(scheduler.isQuiescent());
});

test('WRITE producer: a lease that runs out frees the pages only once the worker reports no push of them runs', () => {
  const { scheduler, kv, env } = makeScheduler({
    numBlocks: 16,
    connector: oneSided(
      { role: 'producer', mode: 'write', leaseMs: 1000 },
      { issueGrant: () => assert.fail('no grant in WRITE mode'), revokeGrant: () => {} },
    ),
  });
  const r = makeRequest(40, 1, { do_remote_decode: true, transfer_id: 'W1' });
  scheduler.addRequest(r);
  const so = scheduler.schedule();
  scheduler.updateFromOutput(so, fakeRun(so));
  assert.equal(kv.getNumFreeBlocks(), 15 - 6, 'held for the decode side');
  env.advanceTo(5000);
  const so2 = scheduler.schedule();
  scheduler.updateFromOutput(so2, fakeRun(so2));
  // The worker learns of the expiry in the next step's metadata; it may be pushing from the pages already.
  assert.equal(kv.getNumFreeBlocks(), 15 - 6, 'not freed while the worker may push from them');
  assert.ok(!scheduler.isQuiescent(), 'the expiry is pending work: steps go on until the worker reports');
  const so3 = scheduler.schedule();
  const meta = so3.kvConnectorMetadata as { expiring: Record<string, string> };
  assert.deepEqual(meta.expiring, { W1: r.requestId }, 'the worker is told which request to report');
  scheduler.updateFromOutput(so3, fakeRun(so3));
  assert.equal(kv.getNumFreeBlocks(), 15 - 6, 'still held: no report yet (a push under way)');
  const so4 = scheduler.schedule();
  scheduler.updateFromOutput(so4, fakeRun(so4, { finishedSending: [r.requestId] }));
  assert.equal(kv.getNumFreeBlocks(), 15, 'freed once the worker reported it');
  assert.ok(scheduler.isQuiescent());
});

test('WRITE consumer: async load parks the request, exempts its pages from zeroing, resumes on finishedRecving', () => {
  const { scheduler, kv } = makeScheduler({ numBlocks: 16, connector: oneSided({ role: 'consumer', mode: 'write' }) });
  const r = makeRequest(33, 2, {
    do_remote_prefill: true,
    remote_engine_id: 'p',
    remote_host: 'h',
    remote_port: 1,
    transfer_id: 'w1',
  });
  scheduler.addRequest(r);
  const so1 = scheduler.schedule();
  assert.equal(r.status, 'WAITING_FOR_REMOTE_KVS');
  assert.equal(so1.totalNumScheduledTokens, 0);
  assert.equal(so1.newBlockIdsToZero, null, 'the skip set exempts exactly the loaded pages');
  assert.equal((so1.kvConnectorMetadata as { reqsToNotify: unknown[] }).reqsToNotify.length, 1);
  scheduler.updateFromOutput(so1, fakeRun(so1));
  const so2 = scheduler.schedule();
  assert.equal(so2.totalNumScheduledTokens, 0, 'still waiting');
  scheduler.updateFromOutput(so2, fakeRun(so2, { finishedRecving: [r.requestId] }));
  const so3 = scheduler.schedule();
  assert.equal(so3.numScheduledTokens[r.requestId], 1, 'full hit: the last token is recomputed');
  assert.equal(kv.getBlockIds(r.requestId)[0]?.length, 3);
});

/** A READ consumer's scheduler, a 33-token request loading two pages per group, and its first step. */
function readingRequest(policy: 'recompute' | 'fail' = 'recompute') {
  const made = makeScheduler({
    numBlocks: 16,
    config: { kvLoadFailurePolicy: policy },
    connector: oneSided({ role: 'consumer', mode: 'read' }),
  });
  const r = makeRequest(
    33,
    2,
    readParams([
      [1, 2],
      [3, 4],
    ]),
  );
  made.scheduler.addRequest(r);
  return { ...made, r, so1: made.scheduler.schedule() };
}

for (const policy of ['recompute', 'fail'] as const) {
  test(`READ failure with kvLoadFailurePolicy=${policy}`, () => {
    const { scheduler, r, so1 } = readingRequest(policy);
    const outs = scheduler.updateFromOutput(so1, fakeRun(so1, { failedLoadReqIds: [r.requestId] }));
    if (policy === 'fail') {
      assert.equal(outs[0]?.error?.code, 'KV_LOAD_FAILED');
      assert.equal(outs[0]?.finishReason, 'error');
      assert.ok(scheduler.isQuiescent());
      return;
    }
    assert.equal(outs.length, 0, 'the sampled token of the failed step is discarded');
    const so2 = scheduler.schedule();
    const again = so2.scheduledNewReqs[0];
    assert.equal(again?.numComputedTokens, 0, 'recomputed locally from the first invalid page');
    assert.equal(so2.numScheduledTokens[r.requestId], 33);
    assert.equal(
      so2.newBlockIdsToZero?.length,
      6,
      'every page from the first invalid one on (both groups) is zeroed again before recompute',
    );
    // Its answer no longer counts the failed load's tokens as loaded from prefill (it counted 32 before
    // session 19: tests read numExternalTokens > 0 as "the KV crossed").
    const [out] = scheduler.updateFromOutput(so2, fakeRun(so2));
    assert.equal(out?.requestId, r.requestId);
    assert.equal(out?.numExternalTokens, 0, 'recomputed, not loaded');
  });
}

test('a READ whose second page is bad is recomputed from there: its first page still counts as loaded', () => {
  const { scheduler, kv, r, so1 } = readingRequest();
  const bad = kv.getBlockIds(r.requestId).map((g) => g[1] as number);
  scheduler.updateFromOutput(so1, fakeRun(so1, { invalidBlockIds: bad }));
  const so2 = scheduler.schedule();
  assert.equal(so2.scheduledNewReqs[0]?.numComputedTokens, 16, 'rolled back to the bad page');
  const [out] = scheduler.updateFromOutput(so2, fakeRun(so2));
  assert.equal(out?.numExternalTokens, 16, 'the first page (16 tokens) came from prefill, the rest was recomputed');
});

test('bad transfer params found at allocation fail that request alone', () => {
  const { scheduler } = makeScheduler({
    numBlocks: 16,
    config: { numLookaheadTokens: 0 },
    connector: oneSided({ role: 'consumer' }),
  });
  // Remote has 1 page per group for a 33-token prompt: decode's 3 pages exceed it by 2 > allowed tail 1.
  const bad = makeRequest(33, 1, readParams([[1], [2]]));
  const good = makeRequest(10, 1);
  scheduler.addRequest(bad);
  scheduler.addRequest(good);
  const so = scheduler.schedule();
  assert.equal(so.numScheduledTokens[good.requestId], 10);
  const outs = scheduler.updateFromOutput(so, fakeRun(so));
  const err = outs.find((o) => o.requestId === bad.requestId);
  assert.equal(err?.error?.code, 'BAD_TRANSFER_PARAMS');
  assert.match(err?.error?.message ?? '', /allowed local tail/);
  assert.ok(scheduler.isQuiescent());
});

test('property: under page pressure, preemption and aborts, no page is owned twice, tokens add up, every request ends, nothing leaks', () => {
  fc.assert(
    fc.property(
      fc.array(
        fc.record({
          prompt: fc.integer({ min: 1, max: 70 }),
          maxTokens: fc.integer({ min: 1, max: 12 }),
          abortAt: fc.option(fc.integer({ min: 1, max: 30 })),
        }),
        {
          minLength: 1,
          maxLength: 12,
        },
      ),
      fc.integer({ min: 14, max: 40 }),
      fc.boolean(),
      (specs, numBlocks, prefixSharing) => {
        const { scheduler, kv } = makeScheduler({
          preset: 'dsv4-mini',
          numBlocks,
          config: { maxNumBatchedTokens: 64, maxNumSeqs: 6, maxModelLen: 100 },
        });
        const reqs = specs.map((s, i) =>
          makeRequest(s.prompt, s.maxTokens, null, `p${i}`, prefixSharing ? 1 : 1 + i * 100),
        );
        const produced = new Map<string, number>();
        const finished = new Map<string, string>();
        for (const r of reqs) scheduler.addRequest(r);
        const queue: ReturnType<typeof scheduler.schedule>[] = [];
        let steps = 0;
        while ((scheduler.hasWork() || queue.length > 0) && steps < 2000) {
          steps++;
          specs.forEach((s, i) => s.abortAt === steps && scheduler.abortRequest(`p${i}`));
          if (queue.length < 2 && scheduler.hasWork()) {
            queue.push(scheduler.schedule());
            // Invariant: a page is owned by two live requests only as a shared prefix page: same group,
            // same position, same tokens in that block.
            const owners = new Map<number, { id: string; group: number; idx: number; tokens: string }>();
            for (const r of reqs) {
              if (!scheduler.requests.has(r.requestId)) continue;
              kv.getBlockIds(r.requestId).forEach((ids, group) =>
                ids.forEach((b, idx) => {
                  const tokens = r.allTokenIds.slice(idx * 16, idx * 16 + 16).join(',');
                  const prev = owners.get(b);
                  if (prev) {
                    assert.equal(prev.group, group, `page ${b} in two groups`);
                    assert.equal(prev.idx, idx, `page ${b} at two positions`);
                    assert.equal(
                      prev.tokens,
                      tokens,
                      `page ${b} shared by ${prev.id} and ${r.requestId} with different tokens`,
                    );
                  }
                  owners.set(b, { id: r.requestId, group, idx, tokens });
                }),
              );
            }
            continue;
          }
          const so = queue.shift();
          if (!so) break;
          for (const o of scheduler.updateFromOutput(so, fakeRun(so))) {
            produced.set(o.requestId, (produced.get(o.requestId) ?? 0) + o.newTokenIds.length);
            if (o.finishReason) finished.set(o.requestId, o.finishReason);
          }
        }
        assert.ok(steps < 2000, 'every request ends within the step budget');
        specs.forEach((s, i) => {
          const why = finished.get(`p${i}`);
          assert.ok(why, `p${i} finished`);
          if (why === 'length') assert.equal(produced.get(`p${i}`), s.maxTokens, 'exactly maxTokens tokens');
          else assert.equal(why, 'abort');
        });
        assert.ok(scheduler.isQuiescent());
        assert.equal(kv.getNumFreeBlocks(), numBlocks - 1, 'every page is back in the pool');
      },
    ),
    { numRuns: 150 },
  );
});

test('async scheduling: pages of a request whose synchronous READ is still in flight are not published for prefix hits; a failed READ never publishes them', () => {
  for (const outcome of ['failed', 'landed'] as const) {
    const { scheduler, kv } = makeScheduler({ numBlocks: 32, connector: oneSided({ role: 'consumer', mode: 'read' }) });
    const a = makeRequest(
      33,
      4,
      readParams([
        [1, 2],
        [3, 4],
      ]),
      `a-${outcome}`,
      500,
    );
    scheduler.addRequest(a);
    const probe = { requestId: 'probe', tokenIds: a.promptTokenIds };
    const s1 = scheduler.schedule();
    assert.equal(s1.hasSyncKvLoads, true);
    const s2 = scheduler.schedule(); // one step ahead: a decodes while its READ (step 1) is still unresolved
    assert.equal(s2.numScheduledTokens[a.requestId], 1);
    assert.equal(kv.getComputedBlocks(probe).numComputedTokens, 0, 'nothing published while the READ may still fail');
    const conn =
      outcome === 'failed'
        ? { failedLoadReqIds: [a.requestId], invalidBlockIds: kv.getBlockIds(a.requestId).flat() }
        : {};
    scheduler.updateFromOutput(s1, fakeRun(s1, conn));
    const hit = kv.getComputedBlocks(probe).numComputedTokens;
    if (outcome === 'failed') assert.equal(hit, 0, 'a failed READ leaves its pages unpublished');
    else assert.equal(hit, 32, 'a landed READ publishes the loaded pages');
  }
});

test('chunked prefill off: a prompt over a step’s token budget is refused at admission (it would never run, holding up the queue)', () => {
  const { scheduler } = makeScheduler({ config: { maxNumBatchedTokens: 32, enableChunkedPrefill: false } });
  assert.throws(
    () => scheduler.addRequest(makeRequest(40, 2)),
    (e: unknown) => e instanceof HandoffError && e.code === 'PROMPT_TOO_LONG' && e.param === 'prompt',
  );
  scheduler.addRequest(makeRequest(32, 2)); // exactly the budget is fine
  assert.equal(scheduler.schedule().totalNumScheduledTokens, 32);
});
