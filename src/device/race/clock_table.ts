/**
 * Clocks the race checker must remember until the host might join them: one per op (for a later
 * wait on its ticket), per event, per NIC work request. Ids are issued in order, so an id below
 * `nextId` that is missing was pruned.
 *
 * Pruning: an entry whose clock the host clock already dominates adds nothing when joined into the
 * host, or into a stream (whose later ops join the host clock at enqueue anyway), so it can go. In a
 * healthy run the host observes a later op or event every step, which dominates all earlier ones on
 * that stream, so the table stays small; the hard bound catches leaks of unobserved work.
 */
import { assert } from '../../util/assert.ts';
import type { VectorClock } from './vector_clock.ts';

const PRUNE_FLOOR = 1024;

export class ClockTable {
  private readonly entries = new Map<number, VectorClock>();
  private nextId = 1;
  private pruneAt = PRUNE_FLOOR;

  constructor(
    private readonly what: string,
    private readonly max: number,
  ) {
    assert(max >= PRUNE_FLOOR, `${what} table bound ${max} is below ${PRUNE_FLOOR}`);
  }

  /** Remember `clock` under a fresh id; `host` is the current host clock, used to prune. */
  add(clock: VectorClock, host: VectorClock): number {
    if (this.entries.size >= this.pruneAt) {
      this.prune(host);
      this.pruneAt = Math.max(PRUNE_FLOOR, this.entries.size * 2);
    }
    assert(
      this.entries.size < this.max,
      () => `race checker: more than ${this.max} ${this.what} clocks not yet observed by the host`,
    );
    const id = this.nextId++;
    this.entries.set(id, clock);
    return id;
  }

  /** The clock of `id`, or null if it was pruned (the host already knows it). */
  get(id: number): VectorClock | null {
    assert(Number.isInteger(id) && id >= 1 && id < this.nextId, `unknown ${this.what} id ${id}`);
    return this.entries.get(id) ?? null;
  }

  delete(id: number): void {
    this.entries.delete(id);
  }

  prune(host: VectorClock): void {
    for (const [id, clock] of this.entries) {
      if (clock.leq(host)) this.entries.delete(id);
    }
  }

  get size(): number {
    return this.entries.size;
  }
}
