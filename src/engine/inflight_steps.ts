/**
 * The steps in flight (scheduled, output not yet processed), per request: the epoch it was scheduled in
 * (outputs of an older epoch are dropped) and the pages the step writes, from its first token computed
 * in the step on (prefix-cached groups). Those pages were published in the prefix cache when allocated,
 * before the forward ran; if the forward fails after the request left (aborted, or preempted to a new
 * epoch while the step ran), this is what still names them, to be withdrawn (step_failures.ts).
 *
 *   step k:   { a: {epoch, pages a writes in k}, b: ... }   taken when step k's output is processed
 */
import { assert } from '../util/assert.ts';

/** Steps in flight at once are bounded by the engine's batch queue; far more means a leak. */
const STEPS_MAX = 1024;

interface Scheduled {
  epoch: number;
  blockIds: number[];
}

/** One processed step's record. */
export interface TakenStep {
  /** Request → epoch when scheduled. */
  epochs: Map<string, number>;
  /**
   * The request's pages written by this step and by every later step still in flight under the same
   * epoch (a request reusing the id, or the request after a preemption, is another).
   */
  writtenFrom(requestId: string): number[];
}

export class InflightSteps {
  private readonly steps = new Map<number, Map<string, Scheduled>>();

  note(step: number, requestId: string, epoch: number, blockIds: number[]): void {
    let m = this.steps.get(step);
    if (m === undefined) {
      assert(this.steps.size < STEPS_MAX, () => `${this.steps.size} steps in flight`);
      m = new Map();
      this.steps.set(step, m);
    }
    m.set(requestId, { epoch, blockIds });
  }

  /** Step `step` is being processed: its record leaves (a step that scheduled nothing has an empty one). */
  take(step: number): TakenStep {
    const taken = this.steps.get(step) ?? new Map<string, Scheduled>();
    this.steps.delete(step);
    const later = [...this.steps].filter(([s]) => s > step).map(([, m]) => m);
    return {
      epochs: new Map([...taken].map(([id, s]) => [id, s.epoch])),
      writtenFrom: (id) => {
        const epoch = taken.get(id)?.epoch;
        return [taken, ...later].flatMap((m) => {
          const s = m.get(id);
          return s !== undefined && s.epoch === epoch ? s.blockIds : [];
        });
      },
    };
  }
}
