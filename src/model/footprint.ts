/**
 * What a forward touches, declared up front for the race checker (src/device/types.ts PageAccess):
 *
 * - attention groups (full_attention, mla, compressor): a READ of every slot of every page of the
 *   request's table, [0, realPageBytes) (attention reads whole pages; padding past the real page is never
 *   read), in every slab of the group's layers, and a WRITE of exactly the byte ranges of the new tokens'
 *   slots (K and V are two ranges);
 * - Mamba groups: a READ of the state [0, realPageBytes) only when startPos > 0 (at 0 the state starts
 *   from zero and the page is not read), marked `state` (it reads the bytes from before the forward's own
 *   writes), and a WRITE of the whole state.
 *
 * With tensor parallel ranks, every rank's slab of each layer (each rank reads and writes its own share,
 * at the offsets of its own page format). Accesses are merged per (slab, block, write): overlapping or
 * touching ranges become one.
 */
import { assert } from '../util/assert.ts';
import type { PageAccess } from '../device/types.ts';
import { everyRankSlabs, realPageBytes, type KVCacheConfig } from '../kv/spec.ts';
import { slotByteRanges, slotLocation } from './pages.ts';
import type { ForwardArgs } from './types.ts';

interface Spans {
  slab: number;
  block: number;
  write: boolean;
  /** A Mamba state read (PageAccess.state): a page is one group's, so every span of the entry is one. */
  state: boolean;
  /** [start0, end0, start1, end1, ...] */
  spans: number[];
}

/** Numeric key of (slab, block, write): slabs and blocks are far below these spans. */
const spanKey = (slab: number, block: number, write: boolean): number => (slab * 2 ** 26 + block) * 2 + Number(write);

export function forwardFootprint(kvConfig: KVCacheConfig, args: ForwardArgs): PageAccess[] {
  const ranges = new Map<number, Spans>();
  const add = (slab: number, block: number, write: boolean, start: number, end: number, state = false): void => {
    const key = spanKey(slab, block, write);
    let entry = ranges.get(key);
    if (entry === undefined) {
      entry = { slab, block, write, state, spans: [] };
      ranges.set(key, entry);
    }
    entry.spans.push(start, end);
  };
  for (const req of args.requests) {
    assert(req.blockTables.length === kvConfig.groups.length, `${req.requestId}: one block table per KV group`);
    kvConfig.groups.forEach((group, g) => {
      const table = req.blockTables[g] as number[];
      const slabs = everyRankSlabs(
        kvConfig,
        group.layerNames.map((_, slab) => slab),
      );
      const spec = group.spec;
      const real = realPageBytes(spec);
      if (spec.type === 'mamba') {
        assert(table.length === 1, `${req.requestId}: a Mamba group holds exactly one state page`);
        const block = table[0] as number;
        for (const slab of slabs) {
          if (req.startPos > 0) add(slab, block, false, 0, real, true);
          add(slab, block, true, 0, real);
        }
        return;
      }
      const end = req.startPos + req.tokenIds.length;
      for (const slab of slabs) {
        for (const block of table) add(slab, block, false, 0, real);
        // The new tokens' slots, a page at a time: consecutive slots of a page are contiguous in each range.
        for (let pos = req.startPos; pos < end;) {
          const { block, slot } = slotLocation(table, spec.blockSize, pos, kvConfig.numBlocks);
          const last = Math.min(end, pos - slot + spec.blockSize) - 1;
          const lo = slotByteRanges(spec, slot);
          const hi = slotByteRanges(spec, slot + (last - pos));
          for (let r = 0; r < lo.length; r++)
            add(slab, block, true, (lo[r] as number[])[0] as number, (hi[r] as number[])[1] as number);
          pos = last + 1;
        }
      }
    });
  }
  const out: PageAccess[] = [];
  for (const e of ranges.values()) mergeSpans(e, out);
  return out.sort(
    (a, b) => a.slab - b.slab || a.block - b.block || Number(a.write) - Number(b.write) || a.start - b.start,
  );
}

/** Push the union of `spans` (flat start/end pairs) as sorted, disjoint, non-touching accesses. */
function mergeSpans({ slab, block, write, state, spans }: Spans, out: PageAccess[]): void {
  const access = (start: number, end: number): PageAccess =>
    state ? { slab, block, start, end, write, state } : { slab, block, start, end, write };
  const n = spans.length / 2;
  const order = Array.from({ length: n }, (_, i) => i);
  if (n > 1)
    order.sort(
      (x, y) =>
        (spans[2 * x] as number) - (spans[2 * y] as number) ||
        (spans[2 * x + 1] as number) - (spans[2 * y + 1] as number),
    );
  let start = spans[2 * (order[0] as number)] as number;
  let end = spans[2 * (order[0] as number) + 1] as number;
  for (let k = 1; k < n; k++) {
    const i = order[k] as number;
    const s = spans[2 * i] as number;
    const e = spans[2 * i + 1] as number;
    if (s <= end) end = Math.max(end, e);
    else {
      out.push(access(start, end));
      start = s;
      end = e;
    }
  }
  out.push(access(start, end));
}
