/**
 * Work-request handles of one `sim` engine: pending -> done | failed exactly once, poll/wait with a
 * timeout, and the host's first observation of the terminal state (the race checker's nicObserved).
 */
import type { RaceCheckerLike } from '../device/types.ts';
import { settleHandle, waitForHandles } from './handle_wait.ts';
import { assert } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import { HandoffError, type ErrorCode } from '../util/errors.ts';
import type { PollResult, TransferHandle, TransferStats } from './types.ts';

export interface HandleState {
  handle: TransferHandle;
  state: 'pending' | 'done' | 'failed';
  error: HandoffError | null;
  rc: RaceCheckerLike | null;
  rcId: number | null;
  observed: boolean;
  itemId: number | null;
  waiters: Set<() => void>;
}

export type HandleCounters = Pick<TransferStats, 'bytesRead' | 'bytesWritten' | 'readsFailed' | 'writesFailed'>;

export class SimHandles {
  /** Pending work requests by handle id. */
  readonly inflight = new Map<number, HandleState>();
  private readonly states = new WeakMap<TransferHandle, HandleState>();

  constructor(
    private readonly engineId: string,
    private readonly env: Env,
    private readonly counters: HandleCounters,
    private readonly onObserved: (itemId: number) => void,
  ) {}

  add(handle: TransferHandle, rc: RaceCheckerLike | null, rcId: number | null): HandleState {
    const st: HandleState = { handle, state: 'pending', error: null, rc, rcId, observed: false, itemId: null, waiters: new Set() };
    this.states.set(handle, st);
    return st;
  }

  finish(st: HandleState, code: ErrorCode | null, message: string): void {
    if (st.state !== 'pending') return;
    this.inflight.delete(st.handle.id);
    settleHandle(st, code, message, this.counters);
  }

  stateOf(handle: TransferHandle): HandleState {
    const st = this.states.get(handle);
    assert(st !== undefined, `handle ${handle.id} was not posted by engine ${this.engineId}`);
    return st;
  }

  observe(st: HandleState): void {
    if (st.observed || st.state === 'pending') return;
    st.observed = true;
    if (st.rc !== null && st.rcId !== null) st.rc.nicObserved(st.rcId);
    if (st.itemId !== null) this.onObserved(st.itemId);
  }

  poll(handle: TransferHandle): PollResult {
    const st = this.stateOf(handle);
    if (st.state === 'pending') return { state: 'pending' };
    this.observe(st);
    return st.state === 'done' ? { state: 'done' } : { state: 'failed', error: st.error as HandoffError };
  }

  wait(handles: readonly TransferHandle[], timeoutMs: number): Promise<void> {
    return waitForHandles(this.env, handles.map((h) => this.stateOf(h)), timeoutMs, { observe: (st) => this.observe(st) });
  }
}
