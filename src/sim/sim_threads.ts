/**
 * Seeds across threads (`handoff sim --jobs N`): N worker threads, each running whole seeds in worlds
 * of its own. The runner hands seeds out in increasing order and consumes the results in the same
 * order, so a run's report (violations, first failing seed, dfs exhaustion) is the same for every N;
 * only the wall time changes.
 *
 *   seeds 1 2 3 4 5 ...  ──> [thread 1: 1 3 5] [thread 2: 2 4] ──> results reordered by seed ──> report
 *
 * A thread is ref'd only while it has a seed; close() terminates them all.
 */
import { Worker } from 'node:worker_threads';
import { assert } from '../util/assert.ts';
import { HandoffError, type ErrorCode } from '../util/errors.ts';
import { holdingLoopOpen } from '../util/env.ts';
import type { SeedOptions, SeedResult } from './run_sim.ts';

export interface ToSimThread {
  seed: number;
  options: SeedOptions;
}

/** A failed seed: its error (stack), and for an operating error its HandoffError code and message. */
export type FromSimThread =
  { seed: number; result: SeedResult } | { seed: number; error: string; code?: ErrorCode; message?: string };

const THREAD_ENTRY = new URL('./sim_thread.mjs', import.meta.url);

interface Waiter {
  resolve(r: SeedResult): void;
  reject(e: Error): void;
}

class SimThread {
  readonly worker = new Worker(THREAD_ENTRY);
  readonly pending = new Map<number, Waiter>();
  dead: string | null = null;

  constructor() {
    this.worker.unref();
    this.worker.on('message', (m: FromSimThread) => {
      const w = this.pending.get(m.seed);
      assert(w !== undefined, `sim thread answered seed ${m.seed} it was not running`);
      this.pending.delete(m.seed);
      if (this.pending.size === 0) this.worker.unref();
      if ('result' in m) w.resolve(m.result);
      else if (m.code !== undefined) w.reject(new HandoffError(m.code, m.message ?? m.error));
      else w.reject(new Error(`seed ${m.seed} crashed the simulator: ${m.error}`));
    });
    const die = (why: string): void => {
      if (this.dead !== null) return;
      this.dead = why;
      for (const w of this.pending.values()) w.reject(new Error(`sim thread died: ${why}`));
      this.pending.clear();
    };
    this.worker.on('error', (e) => die(e.message));
    this.worker.on('exit', (code) => die(`exit code ${code}`));
  }

  run(seed: number, options: SeedOptions): Promise<SeedResult> {
    if (this.dead !== null) return Promise.reject(new Error(`sim thread died: ${this.dead}`));
    return new Promise<SeedResult>((resolve, reject) => {
      if (this.pending.size === 0) this.worker.ref();
      this.pending.set(seed, { resolve, reject });
      this.worker.postMessage({ seed, options } satisfies ToSimThread);
    });
  }
}

export class SimThreads {
  private readonly threads: SimThread[];

  constructor(readonly size: number) {
    assert(Number.isInteger(size) && size >= 1 && size <= 256, `--jobs must be in [1, 256], got ${size}`);
    this.threads = Array.from({ length: size }, () => new SimThread());
  }

  /** Run `seed` on the least loaded thread. */
  run(seed: number, options: SeedOptions): Promise<SeedResult> {
    let best = this.threads[0] as SimThread;
    for (const t of this.threads) if (t.pending.size < best.pending.size) best = t;
    return best.run(seed, options);
  }

  async close(): Promise<void> {
    await holdingLoopOpen(Promise.all(this.threads.map((t) => t.worker.terminate())));
  }
}
