/**
 * Proves the per-slab byte span sets of the page lifecycle against a naive set of bytes (fast-check):
 * after any additions, firstGap finds the first byte of a query outside the set (null when covered) and
 * overlaps tells whether any byte of it is inside.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { addSpan, firstGap, overlaps, type SlabSpans } from './span_set.ts';

const span = fc
  .record({ slab: fc.nat(1), a: fc.nat(40), n: fc.integer({ min: 1, max: 12 }) })
  .map(({ slab, a, n }) => ({ slab, start: a, end: a + n }));

test('property: firstGap and overlaps agree with a naive byte set after any additions', () => {
  fc.assert(
    fc.property(fc.array(span, { maxLength: 8 }), span, (added, q) => {
      const set: SlabSpans = new Map();
      const bytes = new Set<string>();
      for (const s of added) {
        addSpan(set, s);
        for (let i = s.start; i < s.end; i++) bytes.add(`${s.slab}:${i}`);
      }
      const inside = (i: number): boolean => bytes.has(`${q.slab}:${i}`);
      let first = -1;
      for (let i = q.start; i < q.end && first < 0; i++) if (!inside(i)) first = i;
      const gap = firstGap(set, q);
      if (first < 0) assert.equal(gap, null);
      else {
        let end = first;
        while (end < q.end && !inside(end)) end++;
        assert.deepEqual(gap, [first, end]);
      }
      let any = false;
      for (let i = q.start; i < q.end; i++) any ||= inside(i);
      assert.equal(overlaps(set, q), any);
      for (const list of set.values())
        for (let i = 1; i < list.length; i++) assert.ok(list[i - 1]![1] < list[i]![0], 'disjoint, not touching');
    }),
    { numRuns: 500 },
  );
});
