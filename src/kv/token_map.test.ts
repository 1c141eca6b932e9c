/**
 * Proves the token-space mapping between two block sizes: against a naive per-token, per-byte model
 * (fast-check over formats, block sizes 1-64 on each side, paddings, page lists and token runs) every byte
 * of every transferred token lands at exactly its place on the other side, and no byte outside the run is
 * written; a worked example by hand; the clipped tail; a state page moves whole.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { presetKVGroups } from './presets.ts';
import {
  formatPageBytes,
  pageFormatOf,
  slotSpans,
  tailSpans,
  tokenRunRanges,
  type PageFormat,
  type PagedSide,
} from './token_map.ts';

/** Slab offset of byte k of token t in region r on `side` (the page format by hand). */
function byteAt(format: PageFormat & { kind: 'tokens' }, side: PagedSide, t: number, r: number, k: number): number {
  const page = Math.floor(t / side.blockSize);
  const block = side.blockIds[page - side.firstPage] as number;
  const tbs = format.regionTokenBytes;
  const regionStart = side.blockSize * tbs.slice(0, r).reduce((a, b) => a + b, 0);
  return block * side.pageBytes + regionStart + (t - page * side.blockSize) * (tbs[r] as number) + k;
}

function expand(ranges: ReadonlyArray<{ localOffset: number; remoteOffset: number; length: number }>) {
  const m = new Map<number, number>();
  for (const r of ranges)
    for (let i = 0; i < r.length; i++) {
      assert.ok(!m.has(r.localOffset + i), `local byte ${r.localOffset + i} written twice`);
      m.set(r.localOffset + i, r.remoteOffset + i);
    }
  return m;
}

const pow2 = fc.integer({ min: 0, max: 6 }).map((e) => 2 ** e);

const caseArb = fc
  .record({
    tbs: fc.array(fc.integer({ min: 1, max: 6 }), { minLength: 1, maxLength: 3 }),
    lbs: pow2,
    rbs: pow2,
    lpad: fc.nat(5),
    rpad: fc.nat(5),
    start: fc.nat(150),
    len: fc.nat(150),
    seed: fc.nat(),
  })
  .map((c) => {
    const format: PageFormat & { kind: 'tokens' } = { kind: 'tokens', regionTokenBytes: c.tbs };
    const side = (bs: number, pad: number, salt: number): PagedSide => {
      const firstPage = Math.floor(c.start / bs);
      const n = Math.ceil((c.start + c.len) / bs) - firstPage;
      // Distinct page ids in an order drawn from the seed (a permutation of 1..n, scaled apart).
      const key = (i: number): number => Math.imul(i + salt, 2654435761) ^ c.seed;
      const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => key(a) - key(b));
      const ids = order.map((i) => 1 + 2 * i);
      return { blockSize: bs, pageBytes: formatPageBytes(format, bs) + pad, blockIds: ids, firstPage };
    };
    return {
      format,
      local: side(c.lbs, c.lpad, 1),
      remote: side(c.rbs, c.rpad, 5),
      start: c.start,
      end: c.start + c.len,
    };
  });

test('property: every byte of every token in [start, end) maps to its place; nothing outside the run is written', () => {
  fc.assert(
    fc.property(caseArb, ({ format, local, remote, start, end }) => {
      const got = expand(tokenRunRanges(format, local, remote, start, end));
      const want = new Map<number, number>();
      for (let t = start; t < end; t++)
        format.regionTokenBytes.forEach((tb, r) => {
          for (let k = 0; k < tb; k++) want.set(byteAt(format, local, t, r, k), byteAt(format, remote, t, r, k));
        });
      assert.deepEqual(
        [...got.entries()].sort((a, b) => a[0] - b[0]),
        [...want.entries()].sort((a, b) => a[0] - b[0]),
      );
    }),
    { numRuns: 400 },
  );
});

test('property: the mapping is symmetric (swapping the sides swaps every range) and coalesced', () => {
  fc.assert(
    fc.property(caseArb, ({ format, local, remote, start, end }) => {
      const ab = tokenRunRanges(format, local, remote, start, end);
      const ba = tokenRunRanges(format, remote, local, start, end);
      assert.deepEqual(
        [...expand(ab).entries()].map(([l, r]) => `${r}:${l}`).sort(),
        [...expand(ba).entries()].map(([l, r]) => `${l}:${r}`).sort(),
      );
      for (let i = 1; i < ab.length; i++) {
        const [a, b] = [ab[i - 1]!, ab[i]!];
        const touching = a.localOffset + a.length === b.localOffset && a.remoteOffset + a.length === b.remoteOffset;
        assert.ok(!touching, 'contiguous runs on both sides are merged');
      }
    }),
    { numRuns: 200 },
  );
});

test('by hand: K/V pages (2 B per token per region), local 4 tokens/page, remote 8; tokens [2, 7)', () => {
  const format: PageFormat = { kind: 'tokens', regionTokenBytes: [2, 2] };
  // local pages of 4 tokens: 16 B (K 0-7, V 8-15), padded to 20; remote pages of 8 tokens: 32 B (K 0-15, V 16-31).
  const local: PagedSide = { blockSize: 4, pageBytes: 20, blockIds: [5, 3], firstPage: 0 };
  const remote: PagedSide = { blockSize: 8, pageBytes: 32, blockIds: [2], firstPage: 0 };
  assert.deepEqual(tokenRunRanges(format, local, remote, 2, 7), [
    { localOffset: 3 * 20 + 0, remoteOffset: 64 + 8, length: 6 }, // page 3 = tokens 4-6: K slots 0-2 <- remote K 4-6
    { localOffset: 3 * 20 + 8, remoteOffset: 64 + 16 + 8, length: 6 }, // V
    { localOffset: 5 * 20 + 4, remoteOffset: 64 + 4, length: 4 }, // page 5 = tokens 2-3: K slots 2-3 <- remote K 2-3
    { localOffset: 5 * 20 + 12, remoteOffset: 64 + 16 + 4, length: 4 }, // V
  ]);
  assert.deepEqual(tailSpans(format, local, 7), {
    block: 3,
    spans: [
      [6, 8],
      [14, 16],
    ],
  });
  assert.equal(tailSpans(format, local, 8), null, 'a run ending on a page boundary leaves no tail');
  assert.deepEqual(slotSpans(format, 4, 1, 1), []);
});

test('state pages (Mamba) move their state whole, page to page, whatever the block sizes; formats of the presets', () => {
  const [attn, mamba] = presetKVGroups('hybrid-mini', 32);
  const format = pageFormatOf(mamba!.spec);
  assert.deepEqual(format, { kind: 'state', stateBytes: (3 * 64 + 64 * 8) * 4 });
  assert.deepEqual(pageFormatOf(attn!.spec), { kind: 'tokens', regionTokenBytes: [64, 64] });
  const local: PagedSide = { blockSize: 32, pageBytes: 4096, blockIds: [7], firstPage: 0 };
  const remote: PagedSide = { blockSize: 8, pageBytes: 2816, blockIds: [9], firstPage: 0 };
  assert.deepEqual(tokenRunRanges(format, local, remote, 0, 40), [
    { localOffset: 7 * 4096, remoteOffset: 9 * 2816, length: 2816 },
  ]);
  assert.deepEqual(tokenRunRanges(format, { ...local, blockIds: [] }, { ...remote, blockIds: [] }, 0, 40), []);
  assert.equal(tailSpans(format, local, 5), null, 'a state has no tail');
  const [mla, comp] = presetKVGroups('dsv4-mini', 8);
  assert.deepEqual(pageFormatOf(mla!.spec), { kind: 'tokens', regionTokenBytes: [56 + 16 + 8] });
  assert.deepEqual(pageFormatOf(comp!.spec), { kind: 'tokens', regionTokenBytes: [80] });
});

test('programmer errors: pages that do not cover the run, or a block size too big for the page', () => {
  const format: PageFormat = { kind: 'tokens', regionTokenBytes: [4] };
  const local: PagedSide = { blockSize: 4, pageBytes: 16, blockIds: [1], firstPage: 0 };
  const remote: PagedSide = { blockSize: 4, pageBytes: 16, blockIds: [2], firstPage: 0 };
  assert.throws(() => tokenRunRanges(format, local, remote, 0, 5), /do not cover/);
  assert.throws(() => tokenRunRanges(format, { ...local, pageBytes: 15 }, remote, 0, 4), /do not fit/);
  assert.throws(() => tokenRunRanges(format, local, remote, 3, 2), /bad run/);
});
