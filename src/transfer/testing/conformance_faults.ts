/**
 * Transfer conformance, peers and faults (registered by conformance.ts in the same suite): notifications,
 * handshakes and the side channel secret, timeouts, peer death, injected errors, the race checker's
 * wiring, and poll().
 */
import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { OpLabel, PageAccess, RaceCheckerLike } from '../../device/types.ts';
import { RealEnv } from '../../util/env.ts';
import { HandoffError } from '../../util/errors.ts';
import type { Notification } from '../core/types.ts';
import {
  LAYOUT,
  assertLanded,
  label,
  pageRanges,
  readOf,
  rejectsWith,
  untouched,
  type ConformanceSuite,
  type Node,
} from './conformance_support.ts';

export function registerFaultConformance(s: ConformanceSuite): void {
  let P: Node;
  let D: Node;
  before(() => {
    ({ P, D } = s);
  });
  const { backend, make, tid, reset } = s;

  test('notifications are delivered with their payload in both directions; a throwing handler does not break delivery', async () => {
    const atD: Array<[string, Notification]> = [];
    const offThrow = D.engine.onNotification(() => {
      throw new Error('handler bug');
    });
    const offD = D.engine.onNotification((from, n) => atD.push([from, n]));
    const n: Notification = { type: 'write_done', transferId: 'w1', payload: { blockIds: [1, 2, 3], note: 'ok' } };
    const sent = P.engine.stats().notificationsSent;
    await P.engine.notify(D.engine.engineId, n);
    await D.engine.notify(P.engine.engineId, { type: 'remote_blocks', transferId: 'w1', payload: { blockIds: [4] } });
    offD();
    offThrow();
    assert.deepEqual(atD, [[P.engine.engineId, n]]);
    assert.equal(P.engine.stats().notificationsSent, sent + 1);
    const failed = P.engine.stats().notificationsFailed;
    await rejectsWith(P.engine.notify('nobody', { type: 'release', transferId: 'x' }), 'PEER_UNAVAILABLE');
    assert.equal(P.engine.stats().notificationsFailed, failed + 1);
  });

  test('a dropped notification is not delivered and notify() rejects with TIMEOUT (fault switch)', async () => {
    const lossy = await make(2, { engineId: 'lossy', faults: { dropNotificationRate: 1 }, notifyTimeoutMs: 60 });
    await lossy.engine.handshake(D.engine.address());
    let delivered = 0;
    const off = D.engine.onNotification(() => delivered++);
    await rejectsWith(lossy.engine.notify(D.engine.engineId, { type: 'release', transferId: 'x' }), 'TIMEOUT');
    await new RealEnv(0).sleep(30);
    off();
    assert.equal(delivered, 0);
    assert.equal(lossy.engine.stats().notificationsFailed, 1);
  });

  test('handshake refuses incompatible peers with a clear PEER_INCOMPATIBLE, and unknown peers with PEER_UNAVAILABLE', async () => {
    const otherPage = await make(3, { engineId: 'big', layout: { ...LAYOUT, pageBytes: 2048 } });
    await rejectsWith(
      D.engine.handshake(otherPage.engine.address()),
      'PEER_INCOMPATIBLE',
      /pageBytes 2048 != 1024|pageBytes 1024 != 2048/,
    );
    const otherModel = await make(4, { engineId: 'other', modelName: 'other-model' });
    await rejectsWith(D.engine.handshake(otherModel.engine.address()), 'PEER_INCOMPATIBLE', /model/);
    assert.equal(otherModel.engine.stats().handshakesRefused, 1);
    // Another tensor parallel degree, from a peer that does not say how its pages split: refused naming both.
    const tp2 = await make(6, { engineId: 'tp2', layout: { ...LAYOUT, tensorParallelSize: 2 } });
    await rejectsWith(
      D.engine.handshake(tp2.engine.address()),
      'PEER_INCOMPATIBLE',
      /tensor parallel sizes (2 and 1|1 and 2) cannot be mapped \(peer \S+ runs TP=(1|2), engine \S+ TP=(1|2)\)/,
    );
    // With page formats and splits (2 heads: 32 B of a slot per region at TP=1, 16 B per rank at TP=2) it maps.
    const formats = (b: number) => [{ kind: 'tokens' as const, regionTokenBytes: [b, b] }];
    const [one, two] = await Promise.all(
      [1, 2].map((tp) =>
        make(7 + tp, {
          engineId: `heads-tp${tp}`,
          layout: { numSlabs: 2 * tp, numBlocks: 16, pageBytes: 1024 / tp, tensorParallelSize: tp },
          blockSizes: [16],
          pageFormats: formats(32 / tp),
          tpSplits: [2],
        }),
      ),
    );
    const meta = await one!.engine.handshake(two!.engine.address());
    assert.deepEqual([meta.layout.tensorParallelSize, meta.layout.tpSplits], [2, [2]]);
    const sameShapeMoreBlocks = await make(5, { engineId: 'more', layout: { ...LAYOUT, numBlocks: 32 } });
    await D.engine.handshake(sameShapeMoreBlocks.engine.address());
    const gone =
      backend === 'inproc'
        ? { host: 'inproc://no-such-engine', port: 0 }
        : { host: '127.0.0.1', port: otherModel.engine.ports().sideChannel };
    if (backend === 'tcp') await otherModel.engine.close();
    await rejectsWith(D.engine.handshake(gone), 'PEER_UNAVAILABLE');
  });

  test('geometry at the handshake: page formats cross the side channel, mappable block sizes are admitted and each side learns the other’s; unmappable ones are refused by name', async () => {
    const pageFormats = [{ kind: 'tokens' as const, regionTokenBytes: [32] }];
    const at = (id: string, bs: number) =>
      make(7, { engineId: id, blockSizes: [bs], pageFormats, layout: { ...LAYOUT, pageBytes: bs * 32 } });
    const [p8, d32, odd] = await Promise.all([at('geo-p8', 8), at('geo-d32', 32), at('geo-24', 24)]);
    const meta = await d32.engine.handshake(p8.engine.address());
    assert.deepEqual(meta.layout, { ...LAYOUT, pageBytes: 256, tensorParallelSize: 1, blockSizes: [8], pageFormats });
    assert.deepEqual(d32.engine.peerMetadata(p8.engine.engineId)?.layout.blockSizes, [8]);
    assert.deepEqual(p8.engine.peerMetadata(d32.engine.engineId)?.layout, {
      ...LAYOUT,
      pageBytes: 1024,
      tensorParallelSize: 1,
      blockSizes: [32],
      pageFormats,
    });
    assert.equal(d32.engine.peerMetadata('nobody'), null);
    await rejectsWith(d32.engine.handshake(odd.engine.address()), 'PEER_INCOMPATIBLE', /cannot be mapped/);
  });

  test('with a side channel secret, handshakes without it or with a wrong one are refused; the right one works', async () => {
    const S = await make(6, { engineId: 'secure', sideChannelSecret: 'open sesame' });
    const plain = await make(null, { engineId: 'plain' });
    const wrong = await make(null, { engineId: 'wrong', sideChannelSecret: 'open barley' });
    const right = await make(null, { engineId: 'right', sideChannelSecret: 'open sesame' });
    await rejectsWith(plain.engine.handshake(S.engine.address()), 'UNAUTHORIZED');
    await rejectsWith(wrong.engine.handshake(S.engine.address()), 'UNAUTHORIZED');
    assert.equal(S.engine.stats().handshakesRefused, 2);
    await right.engine.handshake(S.engine.address());
    const t = tid();
    const { token } = S.engine.issueGrant({
      transferId: t,
      peerEngineId: right.engine.engineId,
      blockIds: [1],
      ttlMs: 10_000,
    });
    await right.engine.wait([right.engine.postRead(readOf(S, t, token, pageRanges([[1, 1]])))], 5000);
    assertLanded(right, S, [[1, 1]]);
    const h = plain.engine.postRead(readOf(S, t, token, pageRanges([[1, 1]])));
    await rejectsWith(plain.engine.wait([h], 5000), 'PEER_UNAVAILABLE', /no handshake/);
  });

  test('a READ that does not finish in time rejects with KV_READ_TIMEOUT; abort() then guarantees nothing lands', async () => {
    const slow = await make(null, { engineId: 'slow', faults: { readDelayMs: 300 } });
    await slow.engine.handshake(P.engine.address());
    const t = tid();
    const { token } = P.engine.issueGrant({
      transferId: t,
      peerEngineId: slow.engine.engineId,
      blockIds: [1, 2],
      ttlMs: 10_000,
    });
    const h1 = slow.engine.postRead(readOf(P, t, token, pageRanges([[1, 1]])));
    const h2 = slow.engine.postRead(readOf(P, t, token, pageRanges([[2, 2]])));
    await rejectsWith(slow.engine.wait([h1, h2], 40), 'KV_READ_TIMEOUT');
    await slow.engine.abort([h1]);
    const r1 = slow.engine.poll(h1);
    assert.ok(r1.state === 'failed' && r1.error.code === 'REQUEST_ABORTED');
    await slow.engine.wait([h2], 5000);
    await new RealEnv(0).sleep(50);
    assertLanded(slow, P, [[2, 2]]);
  });

  test('the peer closing under a posted READ fails it with a typed error instead of hanging', async () => {
    const P2 = await make(7, { engineId: 'P2' });
    const slow = await make(null, { engineId: 'slow2', faults: { readDelayMs: 300 } });
    const fast = await make(null, { engineId: 'fast2' });
    await slow.engine.handshake(P2.engine.address());
    await fast.engine.handshake(P2.engine.address());
    const t = tid();
    const { token } = P2.engine.issueGrant({
      transferId: t,
      peerEngineId: null,
      blockIds: [...Array(15).keys()].map((b) => b + 1),
      ttlMs: 10_000,
    });
    const all = [...Array(15).keys()].map((b) => [b + 1, b + 1] as const);
    const delayed = slow.engine.postRead(readOf(P2, t, token, pageRanges(all)));
    const racing = fast.engine.postRead(readOf(P2, t, token, pageRanges(all)));
    await P2.engine.close();
    await rejectsWith(slow.engine.wait([delayed], 5000), 'PEER_UNAVAILABLE');
    const outcome = await fast.engine.wait([racing], 5000).then(
      () => 'done',
      (e: unknown) => (e instanceof HandoffError ? e.code : `untyped ${String(e)}`),
    );
    assert.ok(['done', 'PEER_UNAVAILABLE'].includes(outcome), outcome);
  });

  test('an injected READ error fails with TRANSFER_FAILED, moves nothing, and is counted', async () => {
    const flaky = await make(null, { engineId: 'flaky', faults: { readErrorRate: 1 } });
    await flaky.engine.handshake(P.engine.address());
    const t = tid();
    const { token } = P.engine.issueGrant({
      transferId: t,
      peerEngineId: flaky.engine.engineId,
      blockIds: [1],
      ttlMs: 10_000,
    });
    const h = flaky.engine.postRead(readOf(P, t, token, pageRanges([[1, 1]])));
    await rejectsWith(flaky.engine.wait([h], 5000), 'TRANSFER_FAILED', /injected/);
    assert.ok(untouched(flaky));
    assert.equal(flaky.engine.stats().readsFailed, 1);
  });

  test('race checker: nicPost at post with the label and footprint; nicObserved once, when poll/wait sees the completion', async () => {
    const posts: Array<{ label: OpLabel; footprint: PageAccess[] }> = [];
    const observed: number[] = [];
    const rc: RaceCheckerLike = {
      nicPost: (l, f) => posts.push({ label: l, footprint: f }) + 100,
      nicObserved: (id) => void observed.push(id),
    };
    D.engine.attachRaceChecker(rc);
    reset(D);
    const t = tid();
    const { token } = P.engine.issueGrant({
      transferId: t,
      peerEngineId: D.engine.engineId,
      blockIds: [4],
      ttlMs: 10_000,
    });
    const footprint: PageAccess[] = [0, 1].map((slab) => ({
      slab,
      block: 6,
      start: 0,
      end: LAYOUT.pageBytes,
      write: true,
    }));
    const h = D.engine.postRead({ ...readOf(P, t, token, pageRanges([[4, 6]])), footprint });
    assert.deepEqual(posts, [{ label, footprint }]);
    assert.deepEqual(observed, [], 'nothing observed before the host polls or waits');
    await D.engine.wait([h], 5000);
    assert.deepEqual(observed, [101]);
    assert.equal(D.engine.poll(h).state, 'done');
    assert.deepEqual(observed, [101], 'observed once');
    D.engine.attachRaceChecker(null);
  });

  test('poll() reports pending then done without wait(); malformed requests fail locally with BAD_TRANSFER_PARAMS', async () => {
    reset(D);
    const t = tid();
    const { token } = P.engine.issueGrant({
      transferId: t,
      peerEngineId: D.engine.engineId,
      blockIds: [7],
      ttlMs: 10_000,
    });
    const h = D.engine.postRead(readOf(P, t, token, pageRanges([[7, 7]])));
    const env = new RealEnv(0);
    let state = D.engine.poll(h).state;
    for (let i = 0; i < 2000 && state === 'pending'; i++) {
      await env.sleep(1);
      state = D.engine.poll(h).state;
    }
    assert.equal(state, 'done');
    assertLanded(D, P, [[7, 7]]);
    const bad = D.engine.postRead(readOf(P, t, 'not-hex', pageRanges([[7, 7]])));
    const r = D.engine.poll(bad);
    assert.ok(r.state === 'failed' && r.error.code === 'BAD_TRANSFER_PARAMS');
    const beyond = D.engine.postRead(
      readOf(P, t, token, [{ slab: 0, localOffset: 0, remoteOffset: 16 * 1024, length: 1024 }]),
    );
    await rejectsWith(D.engine.wait([beyond], 1000), 'BAD_TRANSFER_PARAMS');
  });
}
