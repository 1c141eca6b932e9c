/**
 * The one conformance suite every transfer backend passes (Hono style: one suite, many
 * implementations). `transferConformance('inproc' | 'tcp')` registers node:test tests; the backend's
 * test file calls it. Each test names what it proves. This file registers the READ core; the grants'
 * lifecycle (conformance_grants.ts) and peers and faults (conformance_faults.ts) register into the same
 * suite, so every backend runs every test. Helpers live in conformance_support.ts.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import type { TransferBackend, TransferEngineOptions } from '../core/types.ts';
import { registerFaultConformance } from './conformance_faults.ts';
import { registerGrantConformance } from './conformance_grants.ts';
import {
  LAYOUT,
  SENTINEL,
  assertLanded,
  makeNode,
  page,
  pageRanges,
  readOf,
  rejectsWith,
  untouched,
  type ConformanceSuite,
  type Node,
} from './conformance_support.ts';

export {
  LAYOUT,
  SENTINEL,
  assertLanded,
  makeNode,
  page,
  pageRanges,
  readOf,
  type Node,
} from './conformance_support.ts';

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

    test('READ and WRITE between different slabs on each side (TP ranks): strided pieces of pages land where named', async () => {
      // Half-page pieces, the way a decode rank of TP=1 reads head slices from two prefill ranks' slabs.
      const half = LAYOUT.pageBytes / 2;
      const ranges = [0, 1].map((remoteSlab) => ({
        slab: 0,
        localOffset: 5 * LAYOUT.pageBytes + remoteSlab * half,
        remoteSlab,
        remoteOffset: 3 * LAYOUT.pageBytes + remoteSlab * half,
        length: half,
      }));
      reset(D);
      const t = tid();
      const g = P.engine.issueGrant({ transferId: t, peerEngineId: D.engine.engineId, blockIds: [3], ttlMs: 10_000 });
      const h = D.engine.postRead(readOf(P, t, g.token, ranges));
      assert.equal(h.descriptors, 2, 'pieces of different remote slabs never merge');
      await D.engine.wait([h], 5000);
      assert.deepEqual(page(D, 0, 5).subarray(0, half), page(P, 0, 3).subarray(0, half));
      assert.deepEqual(page(D, 0, 5).subarray(half), page(P, 1, 3).subarray(half));
      assert.ok(
        page(D, 1, 5).every((x) => x === SENTINEL),
        'local slab 1 is untouched',
      );
      // WRITE the other way: our slab 0 page 5 goes to P's slabs 1 and 0 (crossed), page 7.
      const W = await make(null, { engineId: 'W' });
      await D.engine.handshake(W.engine.address());
      const tw = tid();
      const gw = W.engine.issueGrant({ transferId: tw, peerEngineId: D.engine.engineId, blockIds: [7], ttlMs: 10_000 });
      const crossed = ranges.map((r) => ({ ...r, remoteSlab: 1 - r.remoteSlab, remoteOffset: 7 * LAYOUT.pageBytes }));
      await D.engine.wait([D.engine.postWrite(readOf(W, tw, gw.token, crossed))], 5000);
      assert.deepEqual(page(W, 1, 7).subarray(0, half), page(P, 0, 3).subarray(0, half));
      assert.deepEqual(page(W, 0, 7).subarray(0, half), page(P, 1, 3).subarray(half));
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

    const suite: ConformanceSuite = {
      backend,
      get P() {
        return P;
      },
      get D() {
        return D;
      },
      get E() {
        return E;
      },
      make,
      tid,
      reset,
    };
    registerGrantConformance(suite);
    registerFaultConformance(suite);
  });
}
