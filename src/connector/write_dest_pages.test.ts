/**
 * Prefill in WRITE mode: a `remote_blocks` notification from a decode whose page ids are not pages of that
 * decode's pool (not integers, or far past it) must fail that one push (decode is told `write_refused`
 * and recomputes); nothing is posted and prefill keeps serving. Before: the ids went straight into the
 * WRITE's byte ranges; strings made kv/layout.ts's range assertion throw inside the push, rethrown as a
 * bug from a promise nobody awaits (an unhandled rejection: the prefill process died), and ids past 2^53 /
 * page bytes were posted (the real transfer engine asserts on such offsets: the same crash).
 * Driven through the real OneSidedConnectorWorker over a recording transfer engine.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeProducerRig } from './write_producer_testkit.ts';

const tick = () => new Promise((r) => setImmediate(r));

for (const [what, blockIds] of [
  ['not integers', [['a', 'b', 'c']]],
  ['far past the pool', [[2 ** 53 - 1, 2 ** 53 - 2, 2 ** 53 - 3]]],
] as const) {
  test(`WRITE producer: a destination whose page ids are ${what} fails that push alone`, async () => {
    const { h, worker, step, notify } = writeProducerRig();
    notify('decode-0', {
      type: 'remote_blocks',
      transferId: 'T',
      payload: { blockIds: blockIds as unknown as number[][], skipBlocks: 0, endToken: 40, grant: 'cd'.repeat(16) },
    });
    const so1 = step(1, (m) => {
      m.sendTransfers = { T: 'R' };
      m.reqsToSave = [{ requestId: 'R', transferId: 'T', localBlockIds: [[1, 2, 3]] }];
    });
    await worker.preForward(so1);
    await tick();
    const out1 = await worker.postForward(so1);
    await tick();
    assert.deepEqual(h.posted, [], 'no WRITE posted to pages that are not decode pages');
    assert.deepEqual(
      h.notified.map((n) => n.type),
      ['write_refused'],
      'decode is told nothing will be pushed (it recomputes)',
    );
    let freed = out1.finishedSending.includes('R');
    for (let n = 2; n <= 3 && !freed; n++) {
      const so = step(n, (m) => (m.sendTransfers = { T: 'R' }));
      await worker.preForward(so);
      await tick();
      freed = (await worker.postForward(so)).finishedSending.includes('R');
    }
    assert.ok(freed, "R's pages come back");
  });
}
