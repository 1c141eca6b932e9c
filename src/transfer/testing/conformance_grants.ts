/**
 * Transfer conformance, grants' lifecycle (registered by conformance.ts in the same suite): expiry, single-peer
 * grants, release by the reader, and WRITE into granted pages.
 */
import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../../util/env.ts';
import type { Notification } from '../core/types.ts';
import {
  LAYOUT,
  assertLanded,
  pageRanges,
  readOf,
  rejectsWith,
  untouched,
  type ConformanceSuite,
  type Node,
} from './conformance_support.ts';

export function registerGrantConformance(s: ConformanceSuite): void {
  let P: Node;
  let D: Node;
  let E: Node;
  before(() => {
    ({ P, D, E } = s);
  });
  const { tid, reset } = s;

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

  test('drainGrant after a revoke settles once nothing is served from the pages; a READ after it is refused', async () => {
    reset(D);
    const t = tid();
    const { token } = P.engine.issueGrant({
      transferId: t,
      peerEngineId: D.engine.engineId,
      blockIds: [1, 2],
      ttlMs: 60_000,
    });
    const pairs: Array<[number, number]> = [
      [1, 1],
      [2, 2],
    ];
    const h = D.engine.postRead(readOf(P, t, token, pageRanges(pairs)));
    assert.equal(P.engine.revokeGrant(t), true);
    await P.engine.drainGrant(t);
    // The READ posted before the revoke either was served in full before the drain settled, or refused.
    await D.engine.wait([h], 5000).then(
      () => assertLanded(D, P, pairs),
      (e: unknown) => assert.equal((e as { code?: string }).code, 'GRANT_DENIED'),
    );
    await P.engine.drainGrant(`${t}-never-granted`); // nothing to wait for
    await rejectsWith(
      D.engine.wait([D.engine.postRead(readOf(P, t, token, pageRanges([[1, 1]])))], 5000),
      'GRANT_DENIED',
    );
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
}
