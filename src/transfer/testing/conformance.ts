/**
 * The one conformance suite every transfer backend passes (Hono style: one suite, many
 * implementations). `transferConformance('inproc' | 'tcp')` registers node:test tests; the backend's
 * test file calls it. Each test names what it proves.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import type { OpLabel, PageAccess, RaceCheckerLike } from '../../device/types.ts';
import { RealEnv } from '../../util/env.ts';
import { HandoffError } from '../../util/errors.ts';
import { createTransferEngine } from '../factory.ts';
import type {
  Notification,
  TransferBackend,
  TransferEngine,
  TransferEngineOptions,
  TransferRange,
} from '../core/types.ts';

export const LAYOUT = { numSlabs: 2, numBlocks: 16, pageBytes: 1024 };
export const SENTINEL = 0xee;

export interface Node {
  engine: TransferEngine;
  slabs: Uint8Array[];
}

let counter = 0;

/** An engine over fresh slabs; `seed` fills them with a recognisable pattern, null with SENTINEL. */
export async function makeNode(
  backend: TransferBackend,
  seed: number | null,
  opts: Partial<TransferEngineOptions> = {},
): Promise<Node> {
  const layout = opts.layout ?? LAYOUT;
  const buffers = Array.from(
    { length: layout.numSlabs },
    () => new SharedArrayBuffer(layout.numBlocks * layout.pageBytes),
  );
  const slabs = buffers.map((b) => new Uint8Array(b));
  slabs.forEach((s, i) =>
    seed === null ? s.fill(SENTINEL) : s.forEach((_, o) => (s[o] = (seed * 31 + i * 131 + o * 7 + (o >> 10)) & 0xff)),
  );
  const engine = await createTransferEngine({
    backend,
    env: new RealEnv(seed ?? 99),
    engineId: `${backend}-${opts.engineId ?? 'node'}-${++counter}`,
    modelName: 'tiny',
    preset: 'dsv4-mini',
    blockSizes: [16, 16],
    dataFrameBytes: 4096,
    ...opts,
    layout,
    slabs: buffers,
  });
  return { engine, slabs };
}

/** One range per page per slab: remote block -> local block. */
export function pageRanges(
  pairs: ReadonlyArray<readonly [remote: number, local: number]>,
  pageBytes = LAYOUT.pageBytes,
): TransferRange[] {
  return [0, 1].flatMap((slab) =>
    pairs.map(([r, l]) => ({ slab, localOffset: l * pageBytes, remoteOffset: r * pageBytes, length: pageBytes })),
  );
}

export function page(n: Node, slab: number, block: number): Uint8Array {
  return (n.slabs[slab] as Uint8Array).subarray(block * LAYOUT.pageBytes, (block + 1) * LAYOUT.pageBytes);
}

/** Destination pages equal their source pages; every other destination page still holds SENTINEL. */
export function assertLanded(dst: Node, src: Node, pairs: ReadonlyArray<readonly [src: number, dst: number]>): void {
  const map = new Map(pairs.map(([s, d]) => [d, s]));
  for (let slab = 0; slab < LAYOUT.numSlabs; slab++) {
    for (let b = 0; b < LAYOUT.numBlocks; b++) {
      const from = map.get(b);
      if (from === undefined)
        assert.ok(
          page(dst, slab, b).every((x) => x === SENTINEL),
          `slab ${slab} page ${b} was touched`,
        );
      else assert.deepEqual(page(dst, slab, b), page(src, slab, from), `slab ${slab} page ${b} != source page ${from}`);
    }
  }
}

function untouched(n: Node): boolean {
  return n.slabs.every((s) => s.every((x) => x === SENTINEL));
}

const label: OpLabel = { what: 'conformance', requestIds: ['req-1'], step: 3 };

export function readOf(from: Node, transferId: string, token: string, ranges: TransferRange[]) {
  return {
    peerEngineId: from.engine.engineId,
    transferId,
    grantToken: token,
    ranges,
    label,
    footprint: [] as PageAccess[],
  };
}

async function rejectsWith(p: Promise<unknown>, code: string, message?: RegExp): Promise<HandoffError> {
  const e = await p.then(
    () => assert.fail(`expected ${code}, got success`),
    (err: unknown) => err,
  );
  assert.ok(e instanceof HandoffError, `expected a HandoffError, got ${String(e)}`);
  assert.equal(e.code, code, e.message);
  if (message) assert.match(e.message, message);
  return e;
}

export function transferConformance(backend: TransferBackend): void {
  describe(`transfer conformance: ${backend}`, () => {
    let P: Node; // producer: pattern pages, serves READs
    let D: Node; // consumer: SENTINEL pages, reads
    let E: Node; // another consumer, handshaked with P, never granted anything
    const nodes: Node[] = [];
    const make = async (seed: number | null, opts: Partial<TransferEngineOptions> = {}): Promise<Node> => {
      const n = await makeNode(backend, seed, opts);
      nodes.push(n);
      return n;
    };
    let seq = 0;
    const tid = (): string => `t${++seq}`;
    const reset = (n: Node): void => n.slabs.forEach((s) => s.fill(SENTINEL));

    before(async () => {
      [P, D, E] = await Promise.all([
        make(1, { engineId: 'P' }),
        make(null, { engineId: 'D' }),
        make(null, { engineId: 'E' }),
      ]);
      await D.engine.handshake(P.engine.address());
      await E.engine.handshake(P.engine.address());
    });
    after(async () => {
      await Promise.all(nodes.map((n) => n.engine.close()));
    });

    test('READ copies exactly the granted pages, byte for byte, to the right local offsets; nothing else changes', async () => {
      const pairsArb = fc
        .uniqueArray(fc.integer({ min: 1, max: 15 }), { minLength: 1, maxLength: 8 })
        .chain((remote) =>
          fc.tuple(
            fc.constant(remote),
            fc.uniqueArray(fc.integer({ min: 1, max: 15 }), { minLength: remote.length, maxLength: remote.length }),
          ),
        )
        .map(([remote, local]) => remote.map((r, i) => [r, local[i] as number] as const));
      await fc.assert(
        fc.asyncProperty(pairsArb, async (pairs) => {
          reset(D);
          const t = tid();
          const g = P.engine.issueGrant({
            transferId: t,
            peerEngineId: D.engine.engineId,
            blockIds: pairs.map(([r]) => r),
            ttlMs: 10_000,
          });
          const h = D.engine.postRead(readOf(P, t, g.token, pageRanges(pairs)));
          await D.engine.wait([h], 5000);
          assertLanded(D, P, pairs);
          assert.equal(h.bytes, pairs.length * 2 * LAYOUT.pageBytes);
        }),
        { numRuns: 12 },
      );
    });

    test('contiguous pages coalesce into one work request per slab, across several DATA frames', async () => {
      reset(D);
      const run = [2, 3, 4, 5, 6, 7].map((b) => [b, b + 8] as const);
      const before = D.engine.stats().descriptorsPosted;
      const t = tid();
      const g = P.engine.issueGrant({
        transferId: t,
        peerEngineId: D.engine.engineId,
        blockIds: run.map(([r]) => r),
        ttlMs: 10_000,
      });
      const h = D.engine.postRead(readOf(P, t, g.token, pageRanges([...run].reverse())));
      assert.equal(h.descriptors, 2);
      assert.equal(D.engine.stats().descriptorsPosted - before, 2);
      await D.engine.wait([h], 5000);
      assertLanded(D, P, run);
    });

    test('many READs in flight at once on one peer all land', async () => {
      reset(D);
      const t = tid();
      const pairs = [...Array(12).keys()].map((i) => [i + 1, 15 - i] as const);
      const { token } = P.engine.issueGrant({
        transferId: t,
        peerEngineId: D.engine.engineId,
        blockIds: pairs.map(([r]) => r),
        ttlMs: 10_000,
      });
      const handles = pairs.map((p) => D.engine.postRead(readOf(P, t, token, pageRanges([p]))));
      await D.engine.wait(handles, 5000);
      assertLanded(D, P, pairs);
    });

    for (const [what, setup] of [
      [
        'a page outside the grant',
        (t: string) => ({
          token: P.engine.issueGrant({
            transferId: t,
            peerEngineId: D.engine.engineId,
            blockIds: [1, 2],
            ttlMs: 10_000,
          }).token,
          pairs: [
            [1, 1],
            [2, 2],
            [3, 3],
          ] as const,
        }),
      ],
      [
        'a wrong token',
        (t: string) => (
          P.engine.issueGrant({ transferId: t, peerEngineId: D.engine.engineId, blockIds: [1], ttlMs: 10_000 }),
          { token: '5a'.repeat(16), pairs: [[1, 1]] as const }
        ),
      ],
      [
        'a revoked grant',
        (t: string) => {
          const { token } = P.engine.issueGrant({
            transferId: t,
            peerEngineId: D.engine.engineId,
            blockIds: [1],
            ttlMs: 10_000,
          });
          assert.equal(P.engine.revokeGrant(t), true);
          return { token, pairs: [[1, 1]] as const };
        },
      ],
      [
        'an unknown transfer id',
        () => ({
          token: P.engine.issueGrant({
            transferId: tid(),
            peerEngineId: D.engine.engineId,
            blockIds: [1],
            ttlMs: 10_000,
          }).token,
          pairs: [[1, 1]] as const,
        }),
      ],
    ] as const) {
      test(`READ with ${what} is refused with GRANT_DENIED, writes nothing, and is counted`, async () => {
        reset(D);
        const t = tid();
        const { token, pairs } = setup(t);
        const refused = P.engine.stats().grantsRefused;
        const failed = D.engine.stats().readsFailed;
        await rejectsWith(
          D.engine.wait([D.engine.postRead(readOf(P, t, token, pageRanges(pairs)))], 5000),
          'GRANT_DENIED',
        );
        assert.ok(untouched(D));
        assert.equal(P.engine.stats().grantsRefused, refused + 1);
        assert.equal(D.engine.stats().readsFailed, failed + 1);
      });
    }

    test('READ after the grant expired is refused; the expiry is counted', async () => {
      reset(D);
      const t = tid();
      const { token, expiresAtMs } = P.engine.issueGrant({
        transferId: t,
        peerEngineId: D.engine.engineId,
        blockIds: [1],
        ttlMs: 30,
      });
      assert.ok(expiresAtMs > 0);
      const expired = P.engine.stats().grantsExpired;
      await new RealEnv(0).sleep(80);
      assert.equal(P.engine.stats().grantsExpired, expired + 1);
      const refused = P.engine.stats().grantsRefused;
      await rejectsWith(
        D.engine.wait([D.engine.postRead(readOf(P, t, token, pageRanges([[1, 1]])))], 5000),
        'GRANT_DENIED',
      );
      assert.ok(untouched(D));
      assert.equal(P.engine.stats().grantsRefused, refused + 1);
    });

    test('READ by another engine with the right token is refused (a grant is single-peer)', async () => {
      reset(E);
      const t = tid();
      const { token } = P.engine.issueGrant({
        transferId: t,
        peerEngineId: D.engine.engineId,
        blockIds: [1, 2],
        ttlMs: 10_000,
      });
      const refused = P.engine.stats().grantsRefused;
      await rejectsWith(
        E.engine.wait([E.engine.postRead(readOf(P, t, token, pageRanges([[1, 1]])))], 5000),
        'GRANT_DENIED',
        /not for engine/,
      );
      assert.ok(untouched(E));
      assert.equal(P.engine.stats().grantsRefused, refused + 1);
      const h = D.engine.postRead(readOf(P, t, token, pageRanges([[1, 1]])));
      await D.engine.wait([h], 5000);
    });

    test('a release from the reader with the grant token revokes the grant (a forged one is refused); later READs are refused', async () => {
      reset(D);
      const t = tid();
      const { token } = P.engine.issueGrant({
        transferId: t,
        peerEngineId: D.engine.engineId,
        blockIds: [3],
        ttlMs: 10_000,
      });
      await D.engine.wait([D.engine.postRead(readOf(P, t, token, pageRanges([[3, 3]])))], 5000);
      const got: Array<[string, Notification]> = [];
      const off = P.engine.onNotification((from, n) => got.push([from, n]));
      // A release that does not carry the grant's token ends nothing and reaches no handler.
      const refusedBefore = P.engine.stats().releasesRefused;
      await D.engine.notify(P.engine.engineId, { type: 'release', transferId: t, payload: { grant: 'ef'.repeat(16) } });
      await D.engine.notify(P.engine.engineId, { type: 'release', transferId: t });
      assert.deepEqual(got, []);
      assert.equal(P.engine.stats().releasesRefused, refusedBefore + 2);
      await D.engine.wait([D.engine.postRead(readOf(P, t, token, pageRanges([[3, 3]])))], 5000);
      await D.engine.notify(P.engine.engineId, { type: 'release', transferId: t, payload: { grant: token } });
      off();
      assert.deepEqual(got, [[D.engine.engineId, { type: 'release', transferId: t, payload: { grant: token } }]]);
      assert.equal(P.engine.revokeGrant(t), false, 'already revoked by the release');
      reset(D);
      await rejectsWith(
        D.engine.wait([D.engine.postRead(readOf(P, t, token, pageRanges([[3, 3]])))], 5000),
        'GRANT_DENIED',
      );
      assert.ok(untouched(D));
    });

    test('WRITE lands in the granted destination pages before it completes; a wrong token writes nothing', async () => {
      reset(D);
      const t = tid();
      const pairs = [
        [5, 9],
        [6, 10],
        [7, 11],
        [8, 12],
        [9, 13],
        [10, 14],
        [1, 2],
      ] as const;
      const g = D.engine.issueGrant({
        transferId: t,
        peerEngineId: P.engine.engineId,
        blockIds: pairs.map(([, d]) => d),
        ttlMs: 10_000,
      });
      const ranges = pageRanges(pairs.map(([src, dst]) => [dst, src] as const));
      const written = P.engine.stats().bytesWritten;
      const h = P.engine.postWrite({ ...readOf(D, t, g.token, ranges) });
      await P.engine.wait([h], 5000);
      // Completion derives from the destination: the bytes are there the moment wait() resolves.
      assertLanded(D, P, pairs);
      assert.equal(P.engine.stats().bytesWritten - written, pairs.length * 2 * LAYOUT.pageBytes);

      reset(D);
      const t2 = tid();
      D.engine.issueGrant({ transferId: t2, peerEngineId: P.engine.engineId, blockIds: [9], ttlMs: 10_000 });
      const refused = D.engine.stats().grantsRefused;
      const bad = P.engine.postWrite(readOf(D, t2, '77'.repeat(16), pageRanges([[9, 5]])));
      await rejectsWith(P.engine.wait([bad], 5000), 'GRANT_DENIED');
      assert.ok(untouched(D));
      assert.equal(D.engine.stats().grantsRefused, refused + 1);
    });

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
      const sameShapeMoreBlocks = await make(5, { engineId: 'more', layout: { ...LAYOUT, numBlocks: 32 } });
      await D.engine.handshake(sameShapeMoreBlocks.engine.address());
      const gone =
        backend === 'inproc'
          ? { host: 'inproc://no-such-engine', port: 0 }
          : { host: '127.0.0.1', port: otherModel.engine.ports().sideChannel };
      if (backend === 'tcp') await otherModel.engine.close();
      await rejectsWith(D.engine.handshake(gone), 'PEER_UNAVAILABLE');
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
  });
}
