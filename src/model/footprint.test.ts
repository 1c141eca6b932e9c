/**
 * Proves the forward's declared footprint: reads cover exactly the real bytes of the pages of the
 * request's tables (Mamba: only when resuming), writes exactly the new tokens' slot bytes; and, against the
 * real model, that every byte the forward changes lies in a declared write and that bytes outside
 * the declared reads cannot influence it (they are filled with NaN and the output is unchanged).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MODEL_PRESETS } from '../kv/presets.ts';
import type { PageAccess } from '../device/types.ts';
import { forwardFootprint } from './footprint.ts';
import { createModel } from './model.ts';
import { vocabSizeOf } from './config.ts';
import { kvConfigFor, makeSlabs, PageCounter, promptTokens, request } from './fixtures.ts';
import type { ForwardArgs } from './types.ts';

const page = (slab: number, block: number, end: number): PageAccess => ({ slab, block, start: 0, end, write: false });
const w = (slab: number, block: number, start: number, end: number): PageAccess => ({
  slab,
  block,
  start,
  end,
  write: true,
});

test('dsv4-mini: whole-page reads of every table page in both slabs; writes of exactly positions 14..17 (80 B slots, merged)', () => {
  const kv = kvConfigFor('dsv4-mini');
  const args: ForwardArgs = {
    step: 0,
    requests: [
      request('r', [1, 2, 3, 4], 14, [
        [1, 2, 3],
        [4, 5, 6],
      ]),
    ],
  };
  const want: PageAccess[] = [];
  for (const slab of [0, 1]) {
    for (const block of [1, 2, 3, 4, 5, 6]) {
      want.push(page(slab, block, kv.pageBytes));
      if (block === 1 || block === 4) want.push(w(slab, block, 14 * 80, 16 * 80));
      if (block === 2 || block === 5) want.push(w(slab, block, 0, 2 * 80));
    }
  }
  assert.deepEqual(forwardFootprint(kv, args), want);
});

test('hybrid-mini: K and V are separate write ranges; the Mamba state is read only when resuming, always written whole; padding is never read', () => {
  const kv = kvConfigFor('hybrid-mini');
  const kvSlot = 2 * 16 * 2; // numKvHeads * headSize * bf16
  const state = (3 * 64 + 64 * 8) * 4; // the Mamba page: the common page size at 16 tokens per page
  assert.equal(kv.pageBytes, state);
  const attnReal = 16 * 2 * kvSlot; // 2048 B of K and V: the attention page is padded to 2816
  const first = forwardFootprint(kv, { step: 0, requests: [request('r', [5, 6], 0, [[1], [7]])] });
  const resumed = forwardFootprint(kv, { step: 1, requests: [request('r', [8], 2, [[1], [7]])] });
  const attn = (start: number, n: number): PageAccess[] =>
    [0, 1].flatMap((slab) => [
      page(slab, 1, attnReal),
      w(slab, 1, start * kvSlot, (start + n) * kvSlot),
      w(slab, 1, 16 * kvSlot + start * kvSlot, 16 * kvSlot + (start + n) * kvSlot),
    ]);
  const mamba = (read: boolean): PageAccess[] =>
    [0, 1].flatMap((slab) => [
      ...(read ? [{ ...page(slab, 7, state), state: true as const }] : []),
      w(slab, 7, 0, state),
    ]);
  const order = (xs: PageAccess[]): PageAccess[] =>
    [...xs].sort(
      (a, b) => a.slab - b.slab || a.block - b.block || Number(a.write) - Number(b.write) || a.start - b.start,
    );
  assert.deepEqual(first, order([...attn(0, 2), ...mamba(false)]));
  assert.deepEqual(resumed, order([...attn(2, 1), ...mamba(true)]));
});

test('two requests sharing a read-only prefix page: one read entry per (slab, block), writes kept apart', () => {
  const kv = kvConfigFor('llama-mini');
  const acc = forwardFootprint(kv, {
    step: 0,
    requests: [request('a', [1], 16, [[1, 2]]), request('b', [1], 16, [[1, 3]])],
  });
  assert.equal(acc.filter((a) => a.block === 1 && a.slab === 0).length, 1);
  assert.equal(acc.filter((a) => a.write).length, 2 * 2 * 2); // requests x slabs x (K, V)
});

for (const [preset, tp] of MODEL_PRESETS.flatMap((p) => [1, 2].map((t) => [p, t] as const))) {
  test(`${preset} TP=${tp}: the real forward writes only declared bytes and reads nothing outside the declared reads`, () => {
    const kv = kvConfigFor(preset, 64, tp);
    const pages = new PageCounter(kv, 2);
    const tables = pages.cover([], 40);
    const model = createModel(preset, 4, kv);
    const clean = makeSlabs(kv);
    model.forward(
      { step: 0, requests: [request('r', promptTokens(21, 2, vocabSizeOf(preset)), 0, tables, { sample: false })] },
      clean,
    );
    const args: ForwardArgs = {
      step: 1,
      requests: [request('r', promptTokens(9, 3, vocabSizeOf(preset)), 21, tables)],
    };
    const acc = forwardFootprint(kv, args);
    const inRanges = (list: PageAccess[], slab: number, byte: number): boolean => {
      const block = Math.floor(byte / kv.pageBytes);
      const off = byte % kv.pageBytes;
      return list.some((a) => a.slab === slab && a.block === block && off >= a.start && off < a.end);
    };
    // Poison every byte the footprint does not declare as read: the output must not change.
    const reads = acc.filter((a) => !a.write);
    const poisoned = clean.map((s, slab) => s.map((b, i) => (inRanges(reads, slab, i) ? b : 0xff)));
    const before = clean.map((s) => s.slice());
    const outClean = model.forward(args, clean).outputs[0];
    const outPoisoned = model.forward(args, poisoned).outputs[0];
    assert.equal(outClean?.nanLogits, false);
    assert.deepEqual(outPoisoned, outClean);
    // Every byte that changed is inside a declared write.
    const writes = acc.filter((a) => a.write);
    let changed = 0;
    clean.forEach((s, slab) =>
      s.forEach((b, i) => {
        if (b === before[slab]?.[i]) return;
        changed++;
        assert.ok(inRanges(writes, slab, i), `slab ${slab} byte ${i} changed outside the declared writes`);
      }),
    );
    assert.ok(changed > 0);
  });
}
