/**
 * cancel-everywhere: every cancel point is reached by some seed, in READ and WRITE, and the correct
 * build passes every oracle there; the lease and cancel oracles report what they exist to report (a
 * page held past its lease, success with partial output after a cancel, success over a cut transfer
 * under kv_load_failure_policy 'fail'). The leak-on-cancel mutant is caught in bug_zoo.test.ts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { FabricItem } from '../transfer/sim/sim_fabric.ts';
import { LEASE_HOLD_MS } from './cancel_oracles.ts';
import { judgeEnd } from './oracles.ts';
import { CANCEL_POINTS, type CancelPoint } from './scenarios.ts';
import { SimWorld, type Violation } from './world.ts';

for (const scenario of ['cancel-everywhere', 'cancel-everywhere-write'] as const) {
  test(`${scenario}: every cancel point is applied by some seed (random and PCT), with no violation on the correct build`, async () => {
    const applied = new Set<CancelPoint>();
    for (let seed = 1; seed <= 40 && applied.size < CANCEL_POINTS.length; seed++) {
      for (const strategy of ['random', 'pct'] as const) {
        const w = await SimWorld.create({ scenario, preset: 'dsv4-micro', seed, strategy });
        await w.run();
        await judgeEnd(w);
        await w.shutdown();
        assert.deepEqual(w.violations, [], `${strategy} seed ${seed}`);
        for (const c of w.cancels.applied) {
          applied.add(c.point);
          assert.equal(w.proxy.requests[c.index]?.phase, 'done');
        }
      }
    }
    assert.deepEqual([...applied].sort(), [...CANCEL_POINTS].sort());
  });
}

test("lease oracle: a prefill page lent to decode and still allocated after lease + an in-flight transfer's timeout + slack is reported, naming page and request", async () => {
  const w = await SimWorld.create({ scenario: 'cancel-everywhere', preset: 'dsv4-mini', seed: 1, strategy: 'random' });
  const pool = w.P.engine.kv.blockPool;
  const kept = pool.getNewBlocks(2);
  const freedInTime = pool.getNewBlocks(1);
  const ids = (bs: typeof kept): number[] => bs.map((b) => b.blockId);
  w.proxy.requests[0]!.prefillAnswer = { params: { remote_block_ids: [ids(kept)] }, atMs: 0 };
  w.proxy.requests[1]!.prefillAnswer = { params: { remote_block_ids: [ids(freedInTime)] }, atMs: 0 };
  w.cancelOracles.afterStep();
  w.env.advanceTo(LEASE_HOLD_MS);
  pool.freeBlocks(freedInTime);
  w.cancelOracles.afterStep();
  const found = (): Violation[] => w.violations;
  assert.deepEqual(found(), [], 'within lease + slack nothing is stranded');
  w.env.advanceTo(LEASE_HOLD_MS + 1);
  w.cancelOracles.afterStep();
  assert.deepEqual(
    found().map((v) => v.oracle),
    ['lease', 'lease'],
  );
  assert.match(found()[0]!.message, new RegExp(`^P block ${kept[0]!.blockId}, held for request 0,`));
});

test('cancel oracle: success with partial output after a cancel, and success over a cut transfer under policy fail, are reported', async () => {
  const w = await SimWorld.create({ scenario: 'cancel-everywhere', preset: 'dsv4-mini', seed: 1, strategy: 'random' });
  const ok = (n: number) => ({
    ok: true,
    tokenIds: Array.from({ length: n }, (_, k) => k + 1),
    logitsHashes: [],
    nanLogits: false,
    finishReason: 'length',
    errorCode: null,
    errorMessage: null,
    numExternalTokens: 5,
  });
  const [r0, r1, r2] = w.proxy.requests;
  r0!.outcome = ok(1); // cancelled, 1 of 3 tokens
  r1!.outcome = ok(r1!.spec.sampling.maxTokens); // cancelled late, complete: fine
  r2!.outcome = ok(r2!.spec.sampling.maxTokens); // complete, but its READ failed
  w.cancels.applied.push({ index: 0, point: 'during-decode', atMs: 5, step: 3 });
  w.cancels.applied.push({ index: 1, point: 'during-decode', atMs: 5, step: 3 });
  w.scenario.decode.scheduler.kvLoadFailurePolicy = 'fail';
  const item = { id: 77, kind: 'read', label: { what: 'read', requestIds: ['d-2'] } } as unknown as FabricItem;
  w.fabric.emit({ t: 'fail', item, code: 'TRANSFER_FAILED' });
  w.cancelOracles.judgeEnd();
  assert.deepEqual(
    w.violations.map((v) => v.message.slice(0, 41)),
    ['request 0: cancelled (during-decode) at 5', 'request 2: its transfer net#77 failed, ye'],
  );
  w.violations.length = 0;
  w.scenario.decode.scheduler.kvLoadFailurePolicy = 'recompute';
  r0!.outcome = ok(r0!.spec.sampling.maxTokens);
  w.cancelOracles.judgeEnd();
  assert.deepEqual(w.violations, [], 'under recompute, P/D == colocated judges the output instead');
});
