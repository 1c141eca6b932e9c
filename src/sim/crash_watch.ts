/**
 * The crash oracle's reach past a choice's `apply()`: production code the simulator runs may throw (an
 * assertion above all) in a timer callback (a grant's expiry, a timeout) or in an async continuation nobody
 * awaits (a floating push). Either must become the run's 'crash' violation, with its seed and replay line,
 * not kill the process or the seed thread. A CrashProbe plants one of each for the harness's own tests.
 */
import { assert, AssertionFailure } from '../util/assert.ts';
import { nextMacrotask, type SimEnv } from '../util/env.ts';

/** Test-only: at 1 virtual ms of `seed`, a timer callback asserts, or starts a floating promise that does. */
export interface CrashProbe {
  seed: number;
  kind: 'timer' | 'rejection';
}

export function plantCrashProbe(env: SimEnv, seed: number, probe: CrashProbe | undefined): void {
  if (probe === undefined || probe.seed !== seed) return;
  env.setTimer(1, () => {
    assert(probe.kind !== 'timer', 'crash probe: a timer callback asserts');
    void (async () => {
      await null;
      assert(false, 'crash probe: a floating promise asserts');
    })();
  });
}

export const crashText = (e: unknown): string =>
  `${e instanceof AssertionFailure ? 'assertion failed: ' : ''}${e instanceof Error ? e.message : String(e)}`;

/**
 * The crash oracle: a throw of `fn` (an assertion above all) becomes a 'crash' violation that fails the
 * run with its seed, not an exception out of the run.
 */
export function guarded<T>(crash: (message: string) => void, what: string, fn: () => T): T | undefined {
  try {
    return fn();
    // catch-ok: the crash oracle reports it (the run stops at it, or a replay goes on)
  } catch (e) {
    crash(`${what} threw: ${crashText(e)}`);
    return undefined;
  }
}

/** The clock to `toMs`: a timer callback that throws is a crash; the timers after it still fire. */
export function advanceGuarded(env: SimEnv, crash: (message: string) => void, toMs: number): number {
  for (;;) {
    const fired = guarded(crash, 'a timer callback', () => env.advanceTo(toMs));
    if (fired !== undefined) return fired;
  }
}

/**
 * `body` (a world's run), then a 'crash' for every rejection nobody handled meanwhile (an assertion in a
 * floating continuation). Node reports them only once the tick queue is empty, which the world's loop (one
 * nextTick per step) never lets happen: one macrotask is yielded after `body` to collect them. One world at
 * a time per thread (sim_thread_worker.ts), so each rejection belongs to the world watching.
 */
export async function watchingRejections(body: () => Promise<void>, crash: (message: string) => void): Promise<void> {
  const caught: unknown[] = [];
  const onRejection = (e: unknown): void => void caught.push(e);
  process.on('unhandledRejection', onRejection);
  try {
    await body();
  } finally {
    await nextMacrotask();
    process.off('unhandledRejection', onRejection);
    for (const m of new Set(caught.map(crashText))) crash(`a promise nobody awaits rejected: ${m}`);
  }
}
