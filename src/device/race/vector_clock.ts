/**
 * A vector clock over a growing set of components (host, each stream, each NIC lane). Component i
 * counts the events of agent i that are known to whoever holds the clock; a missing component is 0.
 *
 * Epoch test (FastTrack/CSan style): an access made by component c at tick t happens-before an event
 * with clock V iff V[c] >= t. That needs each component's events to be totally ordered, which is why
 * the NIC, whose work requests complete in any order, is split into lanes (see race_checker.ts).
 */
import { assert } from '../../util/assert.ts';

export class VectorClock {
  private readonly ticks: number[];

  constructor(ticks: readonly number[] = []) {
    this.ticks = [...ticks];
  }

  get(component: number): number {
    return this.ticks[component] ?? 0;
  }

  /** Advance `component` by one and return its new tick. */
  tick(component: number): number {
    assert(Number.isInteger(component) && component >= 0, `bad clock component ${component}`);
    const next = this.get(component) + 1;
    this.set(component, next);
    return next;
  }

  set(component: number, value: number): void {
    assert(Number.isInteger(component) && component >= 0, `bad clock component ${component}`);
    assert(Number.isInteger(value) && value >= 0, `bad clock value ${value}`);
    while (this.ticks.length <= component) this.ticks.push(0);
    this.ticks[component] = value;
  }

  /** this := max(this, other), component by component. */
  join(other: VectorClock): void {
    for (let i = 0; i < other.ticks.length; i++) {
      const v = other.ticks[i] ?? 0;
      if (v > this.get(i)) this.set(i, v);
    }
  }

  /** True iff every component of this is <= that of `other` (this is known to `other`). */
  leq(other: VectorClock): boolean {
    for (let i = 0; i < this.ticks.length; i++) {
      if ((this.ticks[i] ?? 0) > other.get(i)) return false;
    }
    return true;
  }

  copy(): VectorClock {
    return new VectorClock(this.ticks);
  }

  toArray(): number[] {
    return [...this.ticks];
  }
}
