/**
 * Proves the shared ring of posted ranges: whatever the sizes and the order of releases, no two live
 * regions overlap, each holds exactly the ranges put in it until released, a full ring says so (null)
 * instead of overwriting, and an emptied ring takes its whole capacity again.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { RangeRing, type RingRegion } from './range_ring.ts';

test('range ring: live regions never overlap and keep their contents, in any release order', () => {
  fc.assert(
    fc.property(
      fc.array(fc.oneof(fc.integer({ min: 0, max: 40 }), fc.constant(-1)), { maxLength: 80 }),
      fc.array(fc.nat(), { maxLength: 80 }),
      (ops, picks) => {
        const ring = new RangeRing(64);
        const live: Array<{ view: Float64Array; region: RingRegion; want: Float64Array }> = [];
        let k = 0;
        for (const op of ops) {
          if (op < 0) {
            if (live.length === 0) continue;
            const [gone] = live.splice((picks[k++] ?? 0) % live.length, 1);
            if (gone) ring.release(gone.region);
            continue;
          }
          const want = Float64Array.from({ length: op }, () => Math.random());
          const got = ring.alloc(want);
          if (got === null) continue;
          live.push({ ...got, want });
          for (const a of live)
            for (const b of live)
              if (a !== b)
                assert.ok(a.region.end <= b.region.start || b.region.end <= a.region.start, 'live regions overlap');
          for (const l of live) assert.deepEqual(l.view, l.want, 'a live region kept its ranges');
        }
        assert.equal(ring.regionsInUse, live.length);
        for (const l of live) ring.release(l.region);
        assert.notEqual(ring.alloc(new Float64Array(64)), null, 'an empty ring takes its whole capacity');
        assert.equal(ring.alloc(new Float64Array(1)), null, 'and then it is full');
      },
    ),
  );
});
