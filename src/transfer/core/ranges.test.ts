/**
 * Proves range coalescing keeps every byte's local<->remote mapping (on both sort paths of the packed
 * form), the overlap check, the packed and wire forms, and the stream-to-slab mapping.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import {
  RangeStream,
  coalescePacked,
  coalesceRanges,
  disjoint,
  disjointSide,
  packRanges,
  firstPageOutside,
  PageRuns,
  rangeProblem,
  localSide,
  remoteSide,
  sideBytes,
  sideOf,
  sideOfWire,
  sortedBy,
  splitPacked,
  toWire,
  totalBytes,
  unpackRanges,
  wireOfSide,
  wireSide,
} from './ranges.ts';
import type { TransferRange } from './types.ts';

/** Every (slab, local byte) -> remote byte of a set of ranges. */
function byteMap(ranges: readonly TransferRange[]): Map<string, number> {
  const m = new Map<string, number>();
  for (const r of ranges)
    for (let i = 0; i < r.length; i++) m.set(`${r.slab}:${r.localOffset + i}`, r.remoteOffset + i);
  return m;
}

const pageRanges = fc
  .uniqueArray(fc.tuple(fc.integer({ min: 0, max: 2 }), fc.integer({ min: 0, max: 30 })), {
    selector: ([s, b]) => `${s}:${b}`,
    maxLength: 40,
  })
  .chain((pages) =>
    fc.tuple(
      fc.constant(pages),
      fc.array(fc.integer({ min: 0, max: 3 }), { minLength: pages.length, maxLength: pages.length }),
    ),
  )
  .map(([pages, shifts]) =>
    pages.map(([slab, b], i): TransferRange => ({
      slab,
      localOffset: b * 16,
      remoteOffset: (b + (shifts[i] ?? 0)) * 16,
      length: 16,
    })),
  );

test('coalesceRanges: same bytes, same mapping, never more ranges, and contiguous runs become one', () => {
  fc.assert(
    fc.property(pageRanges, (ranges) => {
      const merged = coalesceRanges(ranges);
      assert.equal(totalBytes(merged), totalBytes(ranges));
      assert.deepEqual(byteMap(merged), byteMap(ranges));
      assert.ok(merged.length <= ranges.length);
      for (let i = 1; i < merged.length; i++) {
        const a = merged[i - 1] as TransferRange;
        const b = merged[i] as TransferRange;
        const mergeable =
          a.slab === b.slab &&
          a.remoteOffset + a.length === b.remoteOffset &&
          a.localOffset + a.length === b.localOffset;
        assert.ok(!mergeable, 'two neighbours left unmerged');
      }
    }),
  );
  const run = [3, 1, 2, 0].map((b): TransferRange => ({
    slab: 1,
    localOffset: 100 + b * 8,
    remoteOffset: b * 8,
    length: 8,
  }));
  assert.deepEqual(coalesceRanges(run), [{ slab: 1, localOffset: 100, remoteOffset: 0, length: 32 }]);
});

test('RangeStream: any split of the stream visits exactly the bytes of the ranges, in order', () => {
  fc.assert(
    fc.property(
      fc.array(fc.record({ slab: fc.nat(3), offset: fc.nat(1000), length: fc.integer({ min: 1, max: 50 }) }), {
        minLength: 1,
        maxLength: 10,
      }),
      fc.array(fc.integer({ min: 1, max: 60 }), { maxLength: 30 }),
      (ranges, steps) => {
        const s = new RangeStream(sideOfWire(ranges));
        const seen: string[] = [];
        let left = s.total;
        for (const step of [...steps, s.total]) {
          const n = Math.min(step, left);
          if (n === 0) break;
          s.advance(n, (slab, off, _at, seg) => {
            for (let i = 0; i < seg; i++) seen.push(`${slab}:${off + i}`);
          });
          left -= n;
        }
        assert.ok(s.complete);
        assert.deepEqual(
          seen,
          ranges.flatMap((r) => Array.from({ length: r.length }, (_, i) => `${r.slab}:${r.offset + i}`)),
        );
        assert.throws(() => s.advance(1, () => {}), /past the end/);
      },
    ),
  );
});

test('range checks: slab and bounds, granted pages, overlap', () => {
  const layout = { numSlabs: 2, numBlocks: 4, pageBytes: 100 };
  assert.equal(rangeProblem({ slab: 1, offset: 300, length: 100 }, layout), null);
  assert.match(rangeProblem({ slab: 2, offset: 0, length: 1 }, layout) ?? '', /slab 2/);
  assert.match(rangeProblem({ slab: 0, offset: 301, length: 100 }, layout) ?? '', /beyond/);
  assert.match(rangeProblem({ slab: 0, offset: 0, length: 0 }, layout) ?? '', /bad range/);
  assert.match(rangeProblem({ slab: 0, offset: -1, length: 2 }, layout) ?? '', /bad range/);
  assert.equal(firstPageOutside(100, 200, 100, new PageRuns([1, 2])), null);
  assert.equal(firstPageOutside(100, 201, 100, new PageRuns([1, 2])), 3);
  assert.equal(firstPageOutside(99, 2, 100, new PageRuns([1, 2])), 0);
  assert.ok(
    disjoint([
      { slab: 0, offset: 0, length: 10 },
      { slab: 0, offset: 10, length: 5 },
      { slab: 1, offset: 0, length: 10 },
    ]),
  );
  assert.ok(
    !disjoint([
      { slab: 0, offset: 0, length: 10 },
      { slab: 0, offset: 9, length: 5 },
    ]),
  );
});

/** Ranges whose offsets are small (key-sort path) or near 2^50 (too big to pack into one key: comparator path). */
const anyRanges = fc.oneof(fc.constant(64), fc.constant(2 ** 50)).chain((scale) =>
  fc.array(
    fc.record({
      slab: fc.nat(3),
      localOffset: fc.nat(40).map((x) => x * 16 + (scale > 64 ? scale : 0)),
      remoteOffset: fc.nat(40).map((x) => x * 16 + (scale > 64 ? scale : 0)),
      length: fc.constantFrom(8, 16, 32),
    }),
    { maxLength: 40 },
  ),
);

test('coalescePacked: equals sorting by (slab, remote) and merging neighbours, on either sort path', () => {
  fc.assert(
    fc.property(anyRanges, (ranges) => {
      fc.pre(ranges.length > 0);
      const sorted = [...ranges].sort((a, b) => a.slab - b.slab || a.remoteOffset - b.remoteOffset);
      const merged = coalesceRanges(ranges);
      assert.equal(totalBytes(merged), totalBytes(ranges));
      // Ties on (slab, remote) may order either way; the multiset of bytes' mappings is what matters.
      assert.deepEqual(byteMap(merged), byteMap(sorted));
      for (let i = 1; i < merged.length; i++) {
        const [a, b] = [merged[i - 1] as TransferRange, merged[i] as TransferRange];
        assert.ok(
          a.slab < b.slab || (a.slab === b.slab && a.remoteOffset <= b.remoteOffset),
          'in (slab, remote) order',
        );
      }
      assert.deepEqual(unpackRanges(coalescePacked(packRanges(ranges))), merged);
    }),
  );
});

test('disjointSide: agrees with comparing every pair, on either sort path, the page bitmap, and either side', () => {
  fc.assert(
    fc.property(anyRanges, fc.constantFrom('local' as const, 'remote' as const), (ranges, side) => {
      const key = side === 'local' ? 'localOffset' : 'remoteOffset';
      let naive = true;
      for (let i = 0; i < ranges.length; i++)
        for (let j = i + 1; j < ranges.length; j++) {
          const [a, b] = [ranges[i] as TransferRange, ranges[j] as TransferRange];
          if (a.slab === b.slab && a[key] < b[key] + b.length && b[key] < a[key] + a.length) naive = false;
        }
      assert.equal(disjointSide(sideOf(packRanges(ranges), side)), naive);
      // With a layout of 8-byte pages every range here is whole pages: the bitmap path (or, past the
      // layout's end, the sort) must agree too.
      const layout = { numSlabs: 4, numBlocks: 100, pageBytes: 8 };
      assert.equal(disjointSide(sideOf(packRanges(ranges), side), layout), naive);
      assert.equal(disjointSide(sideOf(packRanges(ranges), side), layout, undefined, 0), naive, 'bitmap path');
      // Coalescing merges only ranges adjacent on both sides: it hides no overlap (the engine checks the
      // merged ranges of a READ).
      assert.equal(disjointSide(sideOf(coalescePacked(packRanges(ranges)), side), layout), naive, 'after coalescing');
    }),
  );
});

test('packed sides: wire ranges round-trip; RangeStream.segment() is the longest run of one slab advance() visits next', () => {
  fc.assert(
    fc.property(anyRanges, (ranges) => {
      fc.pre(ranges.length > 0);
      const remote = sideOf(packRanges(ranges), 'remote');
      const wire = wireOfSide(remote);
      assert.deepEqual(wire, remoteSide(ranges));
      assert.deepEqual(toWire(remote), sideOfWire(wire).p);
      assert.equal(sideBytes(remote), totalBytes(ranges));
      const s = new RangeStream(wireSide(toWire(remote)));
      let prevEnd: [number, number] | null = null;
      while (!s.complete) {
        const seg = s.segment();
        assert.ok(
          prevEnd === null || prevEnd[0] !== seg.slab || prevEnd[1] !== seg.offset,
          'a run stops only where the next bytes do not continue it',
        );
        // The run is one stretch of one slab: advancing over it visits exactly that stretch.
        let at: number = seg.offset;
        s.advance(seg.length, (slab, offset, _piece, n) => {
          assert.deepEqual([slab, offset], [seg.slab, at]);
          at += n;
        });
        prevEnd = [seg.slab, at];
        assert.ok(s.segment(1).length <= s.segment().length, 'a capped look is never longer');
      }
      assert.equal(s.segment().length, 0);
    }),
  );
});

test('RangeStream.peekSegments: the merged stretches the next advance() visits, bounded by count and bytes, not moving', () => {
  fc.assert(
    fc.property(
      anyRanges,
      fc.nat(5000),
      fc.integer({ min: 1, max: 6 }),
      fc.integer({ min: 1, max: 9000 }),
      (ranges, skip, maxSegs, maxBytes) => {
        fc.pre(ranges.length > 0);
        const s = new RangeStream(sideOf(packRanges(ranges), 'local'));
        s.skip(Math.min(skip, s.total));
        const before = s.expected;
        const out = new Float64Array(3 * maxSegs);
        const { count, bytes } = s.peekSegments(out, maxSegs, maxBytes);
        assert.equal(s.expected, before, 'peeking does not move the stream');
        assert.ok(count <= maxSegs && bytes <= maxBytes && bytes <= s.total - before);
        let sum = 0;
        for (let i = 0; i < count; i++) sum += out[3 * i + 2] as number;
        assert.equal(sum, bytes);
        // advance(bytes) visits exactly these stretches, in order, each one run of one slab.
        let i = 0;
        let at = 0;
        s.advance(bytes, (slab, offset, _piece, n) => {
          if (at === (out[3 * i + 2] as number)) [i, at] = [i + 1, 0];
          assert.deepEqual([slab, offset], [out[3 * i], (out[3 * i + 1] as number) + at]);
          at += n;
        });
        // Bounded only by the stream's end, the count, or the bytes.
        assert.ok(bytes === maxBytes || s.complete || count === maxSegs);
        if (count > 1)
          assert.ok(out[0] !== out[3] || (out[1] as number) + (out[2] as number) !== out[4], 'neighbours merged');
      },
    ),
  );
});

test('sortedBy: the same ranges, in (slab, offset) order of the chosen side', () => {
  fc.assert(
    fc.property(anyRanges, fc.constantFrom('local' as const, 'remote' as const), (ranges, side) => {
      const key = side === 'local' ? 'localOffset' : 'remoteOffset';
      const got = unpackRanges(sortedBy(packRanges(ranges), side));
      const str = (rs: TransferRange[]): string[] => rs.map((r) => JSON.stringify(r)).sort();
      assert.deepEqual(str(got), str(ranges), 'a permutation');
      for (let i = 1; i < got.length; i++) {
        const [a, b] = [got[i - 1] as TransferRange, got[i] as TransferRange];
        assert.ok(a.slab < b.slab || (a.slab === b.slab && a[key] <= b[key]), 'in order');
      }
    }),
  );
});

test('splitPacked: the pieces are the ranges, in order, cut into nearly equal byte counts', () => {
  fc.assert(
    fc.property(anyRanges, fc.integer({ min: 1, max: 6 }), (ranges, parts) => {
      fc.pre(ranges.length > 0);
      const pieces = splitPacked(packRanges(ranges), parts);
      const total = totalBytes(ranges);
      assert.equal(pieces.length, Math.min(parts, total));
      const sizes = pieces.map((q) => sideBytes(sideOf(q, 'local')));
      assert.equal(
        sizes.reduce((a, b) => a + b, 0),
        total,
      );
      assert.ok(Math.max(...sizes) - Math.min(...sizes) <= 1, `sizes ${sizes.join(',')}`);
      // Same bytes, same local <-> remote mapping, same order of the stream.
      const flat = pieces.flatMap((q) => unpackRanges(q));
      const stream = (rs: TransferRange[]): string[] =>
        rs.flatMap((r) =>
          Array.from({ length: r.length }, (_, i) => `${r.slab}:${r.localOffset + i}>${r.remoteOffset + i}`),
        );
      assert.deepEqual(stream(flat), stream(ranges));
      assert.ok(
        flat.every((r) => r.length > 0),
        'no empty range',
      );
    }),
  );
});

test('crossed slabs (TP ranks): each side keeps its own slab through pack, coalesce, sort and the wire', () => {
  const crossed = fc.array(
    fc.record({
      slab: fc.nat(3),
      remoteSlab: fc.nat(3),
      localOffset: fc.nat(40).map((x) => x * 16),
      remoteOffset: fc.nat(40).map((x) => x * 16),
      length: fc.constantFrom(8, 16, 32),
    }),
    { minLength: 1, maxLength: 40 },
  );
  // (local slab, local byte) -> (remote slab, remote byte): what a copy does, whatever the ranges look like.
  const bytes = (rs: readonly TransferRange[]): string[] =>
    rs
      .flatMap((r) =>
        Array.from(
          { length: r.length },
          (_, i) => `${r.slab}:${r.localOffset + i}>${r.remoteSlab ?? r.slab}:${r.remoteOffset + i}`,
        ),
      )
      .sort();
  fc.assert(
    fc.property(crossed, (ranges) => {
      const merged = unpackRanges(coalescePacked(packRanges(ranges)));
      assert.deepEqual(bytes(merged), bytes(ranges), 'same bytes, same mapping');
      for (let i = 1; i < merged.length; i++) {
        const [a, b] = [merged[i - 1] as TransferRange, merged[i] as TransferRange];
        const [ra, rb] = [a.remoteSlab ?? a.slab, b.remoteSlab ?? b.slab];
        assert.ok(ra < rb || (ra === rb && a.remoteOffset <= b.remoteOffset), 'in (remote slab, remote) order');
      }
      assert.deepEqual(bytes(unpackRanges(sortedBy(packRanges(ranges), 'local'))), bytes(ranges));
      const p = packRanges(ranges);
      assert.deepEqual(wireOfSide(sideOf(p, 'remote')), remoteSide(ranges));
      assert.deepEqual(wireOfSide(sideOf(p, 'local')), localSide(ranges));
    }),
  );
  // Two halves of one local page from two remote slabs: adjacent locally and remotely, but never one range.
  const halves = [0, 1].map((remoteSlab) => ({
    slab: 0,
    remoteSlab,
    localOffset: remoteSlab * 8,
    remoteOffset: remoteSlab * 8,
    length: 8,
  }));
  assert.equal(coalesceRanges(halves).length, 2);
  assert.equal(coalesceRanges(halves.map((h) => ({ ...h, remoteSlab: 1 }))).length, 1);
});

test('PageRuns.firstOutside: the first page of [first, last] missing from the set, as a scan of a Set says', () => {
  fc.assert(
    fc.property(fc.array(fc.nat(60), { maxLength: 40 }), fc.nat(64), fc.nat(12), (pages, first, span) => {
      const set = new Set(pages);
      let want: number | null = null;
      for (let b = first; b <= first + span; b++)
        if (!set.has(b)) {
          want = b;
          break;
        }
      assert.equal(new PageRuns(pages).firstOutside(first, first + span), want);
    }),
    { numRuns: 2000 },
  );
});
