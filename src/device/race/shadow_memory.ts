/**
 * Shadow memory of the race checker: per (slab, block), the accesses that no later access has yet
 * dominated, each with the (component, tick) epoch of the agent that made it.
 *
 *   page (slab 1, block 7):  [0,64) write compute@12   [64,128) read nic-lane-0@3   [0,128) read host@40
 *
 * A new access b is checked against every kept access a on overlapping bytes: if at least one writes
 * and a does not happen-before b (b's clock has not seen a's epoch), that is a race. Records arrive in
 * host program order, and a record's clock only contains what was recorded before it, so b can never
 * happen-before an earlier a: one direction is enough.
 *
 * Memory stays bounded (CSan keeps "last write + reads since"): a kept read is dropped, on the bytes b
 * covers, once b happens-after it; a kept write only once a later *write* happens-after it. Dropping
 * loses no race: if a -> b and some later c is unordered with a, then c is unordered with b too (else
 * a -> b -> c), and b conflicts with c whenever a did under these rules.
 */
import { assert } from '../../util/assert.ts';
import type { AccessSource } from './race_report.ts';
import type { OpLabel, PageAccess } from '../types.ts';
import type { VectorClock } from './vector_clock.ts';

/** Who made an access, without the byte range. */
export interface AccessOwner {
  agent: string;
  source: AccessSource;
  id: number;
  label: OpLabel;
}

export interface ShadowEntry {
  start: number;
  end: number;
  write: boolean;
  component: number;
  tick: number;
  owner: AccessOwner;
}

export interface NewAccess extends ShadowEntry {
  slab: number;
  block: number;
  /** The clock of the agent at the access; decides happens-before against kept entries. */
  clock: VectorClock;
}

export type RaceSink = (earlier: ShadowEntry, later: NewAccess, overlap: { start: number; end: number }) => void;

const BLOCK_KEY_SPAN = 2 ** 24;
/** Kept entries per page: a handful per agent; more means fragmentation gone wrong. */
export const SHADOW_ENTRIES_PER_PAGE_MAX = 4096;

export class ShadowMemory {
  private readonly pages = new Map<number, ShadowEntry[]>();

  /**
   * Record access `acc` by `component` at `tick` (its agent's clock `clock`), reporting every race with a kept
   * entry to `onRace`. Allocation-light, as this runs for every page of every op: the kept list is compacted in
   * place, and copied only when an entry must be split (its order is kept either way, so reports come out in
   * the same order).
   */
  record(
    acc: PageAccess,
    component: number,
    tick: number,
    owner: AccessOwner,
    clock: VectorClock,
    onRace: RaceSink,
  ): void {
    if (!(acc.start < acc.end)) assert(false, `empty access [${acc.start},${acc.end})`);
    if (!(acc.block >= 0 && acc.block < BLOCK_KEY_SPAN)) assert(false, `block ${acc.block} out of range`);
    if (!(acc.slab >= 0 && Number.isInteger(acc.slab))) assert(false, `bad slab ${acc.slab}`);
    const key = acc.slab * BLOCK_KEY_SPAN + acc.block;
    let kept = this.pages.get(key);
    if (kept === undefined) {
      kept = [];
      this.pages.set(key, kept);
    }
    const n = kept.length;
    let w = 0;
    // Becomes a copy of the survivors so far at the first split; null while compacting in place.
    let next: ShadowEntry[] | null = null;
    for (let i = 0; i < n; i++) {
      const a = kept[i] as ShadowEntry;
      const start = Math.max(a.start, acc.start);
      const end = Math.min(a.end, acc.end);
      const overlaps = start < end;
      const ordered = overlaps && clock.get(a.component) >= a.tick;
      if (overlaps && !ordered && (a.write || acc.write)) {
        onRace(a, { ...acc, component, tick, owner, clock }, { start, end });
      }
      if (!(ordered && (acc.write || !a.write))) {
        if (next !== null) next.push(a);
        else kept[w++] = a;
        continue;
      }
      // Dominated: only the bytes the later access covers are dropped; the rest of `a` stays, in place.
      if (a.start < start || end < a.end) {
        next ??= kept.slice(0, w);
        if (a.start < start) next.push({ ...a, end: start });
        if (end < a.end) next.push({ ...a, start: end });
      }
    }
    const list = next ?? kept;
    if (next === null) kept.length = w;
    else this.pages.set(key, next);
    list.push({ start: acc.start, end: acc.end, write: acc.write, component, tick, owner });
    if (list.length > SHADOW_ENTRIES_PER_PAGE_MAX)
      assert(false, `shadow page (${acc.slab}, ${acc.block}) over its bound`);
  }

  /** Kept entries over all pages (for the memory-bound tests). */
  entryCount(): number {
    let n = 0;
    for (const list of this.pages.values()) n += list.length;
    return n;
  }

  clear(): void {
    this.pages.clear();
  }
}
