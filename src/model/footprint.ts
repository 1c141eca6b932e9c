/**
 * What a forward touches, declared up front for the race checker (src/device/types.ts PageAccess):
 *
 * - attention groups (full_attention, mla, compressor): a READ of every whole page [0, pageBytes) of
 *   every block in the request's table, in every slab of the group's layers (attention reads whole
 *   pages), and a WRITE of exactly the byte ranges of the new tokens' slots (K and V are two ranges);
 * - Mamba groups: a READ of the whole state page only when startPos > 0 (at 0 the state starts from
 *   zero and the page is not read) and a WRITE of the whole page.
 *
 * With tensor parallel ranks, every rank's slab of each layer (each rank reads and writes its own share,
 * at the offsets of its own page format). Accesses are merged per (slab, block, write): overlapping or
 * touching ranges become one.
 */
import { assert } from '../util/assert.ts';
import type { PageAccess } from '../device/types.ts';
import { everyRankSlabs, type KVCacheConfig } from '../kv/spec.ts';
import { slotByteRanges, slotLocation } from './pages.ts';
import type { ForwardArgs } from './types.ts';

export function forwardFootprint(kvConfig: KVCacheConfig, args: ForwardArgs): PageAccess[] {
  const ranges = new Map<string, { slab: number; block: number; write: boolean; spans: Array<[number, number]> }>();
  const add = (slab: number, block: number, write: boolean, start: number, end: number): void => {
    const key = `${slab}:${block}:${write ? 'w' : 'r'}`;
    let entry = ranges.get(key);
    if (!entry) {
      entry = { slab, block, write, spans: [] };
      ranges.set(key, entry);
    }
    entry.spans.push([start, end]);
  };
  const pageBytes = kvConfig.pageBytes;
  for (const req of args.requests) {
    assert(req.blockTables.length === kvConfig.groups.length, `${req.requestId}: one block table per KV group`);
    kvConfig.groups.forEach((group, g) => {
      const table = req.blockTables[g] as number[];
      const slabs = everyRankSlabs(
        kvConfig,
        group.layerNames.map((_, slab) => slab),
      );
      const spec = group.spec;
      if (spec.type === 'mamba') {
        assert(table.length === 1, `${req.requestId}: a Mamba group holds exactly one state page`);
        const block = table[0] as number;
        for (const slab of slabs) {
          if (req.startPos > 0) add(slab, block, false, 0, pageBytes);
          add(slab, block, true, 0, pageBytes);
        }
        return;
      }
      for (const slab of slabs) {
        for (const block of table) add(slab, block, false, 0, pageBytes);
        for (let pos = req.startPos; pos < req.startPos + req.tokenIds.length; pos++) {
          const { block, slot } = slotLocation(table, spec.blockSize, pos, kvConfig.numBlocks);
          for (const [start, end] of slotByteRanges(spec, slot)) add(slab, block, true, start, end);
        }
      }
    });
  }
  const out: PageAccess[] = [];
  for (const { slab, block, write, spans } of ranges.values()) {
    spans.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    let [start, end] = spans[0] as [number, number];
    for (const [s, e] of spans.slice(1)) {
      if (s <= end) end = Math.max(end, e);
      else {
        out.push({ slab, block, start, end, write });
        [start, end] = [s, e];
      }
    }
    out.push({ slab, block, start, end, write });
  }
  return out.sort(
    (a, b) => a.slab - b.slab || a.block - b.block || Number(a.write) - Number(b.write) || a.start - b.start,
  );
}
