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
import type { OpLabel } from '../types.ts';
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

  record(access: NewAccess, onRace: RaceSink): void {
    assert(access.start < access.end, `empty access [${access.start},${access.end})`);
    assert(access.block >= 0 && access.block < BLOCK_KEY_SPAN, `block ${access.block} out of range`);
    assert(access.slab >= 0 && Number.isInteger(access.slab), `bad slab ${access.slab}`);
    const key = access.slab * BLOCK_KEY_SPAN + access.block;
    const kept = this.pages.get(key) ?? [];
    const next: ShadowEntry[] = [];
    for (const a of kept) {
      const start = Math.max(a.start, access.start);
      const end = Math.min(a.end, access.end);
      if (start >= end) {
        next.push(a);
        continue;
      }
      const ordered = access.clock.get(a.component) >= a.tick;
      if (!ordered && (a.write || access.write)) onRace(a, access, { start, end });
      const dominated = ordered && (access.write || !a.write);
      if (!dominated) {
        next.push(a);
        continue;
      }
      // Invariant: only the bytes the later access covers are dropped; the rest of `a` stays.
      if (a.start < start) next.push({ ...a, end: start });
      if (end < a.end) next.push({ ...a, start: end });
    }
    next.push({
      start: access.start,
      end: access.end,
      write: access.write,
      component: access.component,
      tick: access.tick,
      owner: access.owner,
    });
    assert(next.length <= SHADOW_ENTRIES_PER_PAGE_MAX, `shadow page (${access.slab}, ${access.block}) over its bound`);
    this.pages.set(key, next);
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
