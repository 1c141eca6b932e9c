/** Proves the grant check refuses each way a request can leave its grant, and admits exactly the granted pages. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { GrantTable, type GrantDecision, type GrantQuery } from './grant_table.ts';
import { sideOfWire, type SideRanges, type WireRange } from './ranges.ts';

/** The table queried with ranges as objects (their packing is proved in ranges.test.ts). */
class WireTable extends GrantTable {
  override check(query: Omit<GrantQuery, 'ranges'> & { ranges: SideRanges | readonly WireRange[] }): GrantDecision {
    const r = query.ranges;
    return super.check({ ...query, ranges: 'p' in r ? r : sideOfWire(r) });
  }
}

const layout = { numSlabs: 2, numBlocks: 16, pageBytes: 64 };
const TOKEN = 'ab'.repeat(16);

function table(blockIds = [2, 3, 7], peer: string | null = 'D', expiresAtMs = 1000): WireTable {
  const t = new WireTable(layout);
  t.add({ transferId: 'x', token: TOKEN, peerEngineId: peer, blockIds, expiresAtMs });
  return t;
}
const q = { peerEngineId: 'D', transferId: 'x', token: TOKEN, nowMs: 10 };

test('grant check: the right peer, token and pages inside the grant pass, in every slab', () => {
  const t = table();
  assert.deepEqual(
    t.check({
      ...q,
      ranges: [
        { slab: 0, offset: 128, length: 128 },
        { slab: 1, offset: 7 * 64 + 3, length: 10 },
      ],
    }),
    { ok: true },
  );
  assert.deepEqual(
    table([2], null).check({ ...q, peerEngineId: 'anyone', ranges: [{ slab: 1, offset: 128, length: 64 }] }),
    { ok: true },
  );
});

test('grant check: wrong token, unknown transfer, wrong peer, expired, revoked, outside pages, bad ranges are refused', () => {
  const r = [{ slab: 0, offset: 128, length: 64 }];
  const refused = (d: ReturnType<GrantTable['check']>, re: RegExp) => {
    assert.equal(d.ok, false);
    if (!d.ok) assert.match(d.reason, re);
  };
  refused(table().check({ ...q, token: 'cd'.repeat(16), ranges: r }), /wrong grant token/);
  refused(table().check({ ...q, token: TOKEN + 'ab', ranges: r }), /wrong grant token/);
  refused(table().check({ ...q, token: 'zz', ranges: r }), /malformed/);
  refused(table().check({ ...q, transferId: 'y', ranges: r }), /no live grant/);
  refused(table().check({ ...q, peerEngineId: 'E', ranges: r }), /not for engine E/);
  const t = table();
  refused(t.check({ ...q, nowMs: 1000, ranges: r }), /expired/);
  refused(t.check({ ...q, nowMs: 0, ranges: r }), /no live grant/);
  const rv = table();
  assert.equal(rv.revoke('x'), true);
  refused(rv.check({ ...q, ranges: r }), /no live grant/);
  refused(table().check({ ...q, ranges: [{ slab: 0, offset: 128, length: 129 }] }), /page 4 is not granted/);
  refused(table().check({ ...q, ranges: [{ slab: 2, offset: 128, length: 1 }] }), /slab 2/);
  refused(table().check({ ...q, ranges: [{ slab: 0, offset: 16 * 64 - 1, length: 2 }] }), /beyond/);
  refused(table().check({ ...q, ranges: [] }), /no ranges/);
});

test('grant check: a byte range passes iff every page it touches is granted (property)', () => {
  fc.assert(
    fc.property(
      fc.uniqueArray(fc.integer({ min: 0, max: 15 }), { maxLength: 16 }),
      fc.integer({ min: 0, max: 16 * 64 - 1 }),
      fc.integer({ min: 1, max: 300 }),
      (blocks, offset, length) => {
        fc.pre(offset + length <= 16 * 64);
        const d = table(blocks).check({ ...q, ranges: [{ slab: 1, offset, length }] });
        const pages = new Set<number>();
        for (let b = Math.floor(offset / 64); b <= Math.floor((offset + length - 1) / 64); b++) pages.add(b);
        assert.equal(
          d.ok,
          [...pages].every((p) => blocks.includes(p)),
        );
      },
    ),
  );
});

test('grant table: sweep drops expired grants only', () => {
  const t = table([1], 'D', 50);
  t.add({ transferId: 'y', token: TOKEN, peerEngineId: 'D', blockIds: [1], expiresAtMs: 500 });
  assert.equal(t.sweep(100), 1);
  assert.equal(t.size, 1);
});

test('grant check: a grant issued without a peer binds to its first valid user; another engine is then refused', () => {
  const t = table([2], null);
  const r = [{ slab: 0, offset: 128, length: 64 }];
  assert.deepEqual(
    t.check({ ...q, peerEngineId: 'thief', token: 'cd'.repeat(16), ranges: r }).ok,
    false,
    'a wrong token binds nothing',
  );
  assert.deepEqual(t.check({ ...q, peerEngineId: 'D1', ranges: r }), { ok: true });
  assert.deepEqual(t.check({ ...q, peerEngineId: 'D1', ranges: r }), { ok: true }, 'the bound peer may read again');
  const other = t.check({ ...q, peerEngineId: 'D2', ranges: r });
  assert.equal(other.ok, false);
  assert.match((other as { reason: string }).reason, /not for engine D2/);
});
