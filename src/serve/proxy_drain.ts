/**
 * The proxy's drain on SIGTERM (`handoff up`, `handoff proxy`): new completions are refused (503
 * OVERLOADED, and /health answers 503) while those under way run to their answer, bounded. Before, the
 * proxy's close() cut every completion under way with a connection reset, while the instances behind it
 * drained theirs (`proxy_drain.test.ts`).
 */
import type { Env } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';

/** How long `up` and `proxy` wait on SIGTERM for the completions under way (within their stop bounds). */
export const PROXY_DRAIN_MS = 25_000;

/** Counts the completions under way; refuses new ones once draining. */
export class CompletionGate {
  private inFlight = 0;
  private draining = false;

  constructor(private readonly env: Env) {}

  get isDraining(): boolean {
    return this.draining;
  }

  /** Run one completion, counted until it is answered; OVERLOADED once the drain began. */
  async run(fn: () => Promise<void>): Promise<void> {
    if (this.draining) throw new HandoffError('OVERLOADED', 'the proxy is draining');
    this.inFlight++;
    try {
      await fn();
    } finally {
      this.inFlight--;
    }
  }

  /** Refuse new completions and wait until none is under way; false when `timeoutMs` ran out first. */
  async drain(timeoutMs: number): Promise<boolean> {
    this.draining = true;
    const deadline = this.env.nowMs() + timeoutMs;
    while (this.inFlight > 0) {
      if (this.env.nowMs() >= deadline) return false;
      await this.env.sleep(20);
    }
    return true;
  }
}
