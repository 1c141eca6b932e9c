/**
 * Env: the only door to time, timers and randomness. Everything nondeterministic goes through an
 * injected Env, so the simulator can run the same code on a virtual clock with a seeded PRNG.
 *
 * This file (and the real device/transfer backends) are the only places allowed to touch
 * Date.now, performance.now, setTimeout and Math.random; tidy.test.ts enforces it.
 */
import { randomBytes as cryptoRandomBytes } from 'node:crypto';
import { assert } from './assert.ts';

export interface TimerHandle {
  cancel(): void;
}

export interface Rng {
  /** Uniform float in [0, 1). */
  next(): number;
  /** Uniform integer in [0, n). */
  int(n: number): number;
  /** A new independent generator derived from this one. */
  fork(): Rng;
}

export interface Env {
  /** Monotonic milliseconds (fractional). */
  nowMs(): number;
  /** Wall-clock milliseconds since the epoch (for `created` fields only). */
  wallMs(): number;
  setTimer(delayMs: number, fn: () => void): TimerHandle;
  /** Resolve after delayMs. */
  sleep(delayMs: number): Promise<void>;
  /** Seeded randomness (reproducible). */
  rng: Rng;
  /** Unpredictable bytes for secrets (grant tokens, request ids). Seeded in the simulator. */
  secureRandomBytes(n: number): Uint8Array;
}

/** xoshiro128** seeded through splitmix32: fast, 32-bit, reproducible on every machine. */
export class SeededRng implements Rng {
  private s0: number;
  private s1: number;
  private s2: number;
  private s3: number;

  constructor(seed: number) {
    assert(Number.isFinite(seed), 'seed must be a finite number');
    let x = seed >>> 0;
    const split = (): number => {
      x = (x + 0x9e3779b9) >>> 0;
      let z = x;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
      return (z ^ (z >>> 16)) >>> 0;
    };
    this.s0 = split();
    this.s1 = split();
    this.s2 = split();
    this.s3 = split();
    if ((this.s0 | this.s1 | this.s2 | this.s3) === 0) this.s0 = 1;
  }

  nextU32(): number {
    const result = Math.imul(rotl(Math.imul(this.s1, 5) >>> 0, 7), 9) >>> 0;
    const t = (this.s1 << 9) >>> 0;
    this.s2 ^= this.s0;
    this.s3 ^= this.s1;
    this.s1 ^= this.s2;
    this.s0 ^= this.s3;
    this.s2 ^= t;
    this.s3 = rotl(this.s3, 11);
    this.s0 >>>= 0;
    this.s1 >>>= 0;
    this.s2 >>>= 0;
    this.s3 >>>= 0;
    return result;
  }

  next(): number {
    return this.nextU32() / 4294967296;
  }

  int(n: number): number {
    assert(Number.isInteger(n) && n > 0, `rng.int needs a positive integer, got ${n}`);
    return Math.floor(this.next() * n);
  }

  fork(): Rng {
    return new SeededRng(this.nextU32());
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

/** The longest delay one setTimeout honours (2^31 - 1 ms). */
const TIMER_STEP_MAX_MS = 2 ** 31 - 1;

/** The real world: wall clock, real timers, crypto for secrets. */
export class RealEnv implements Env {
  readonly rng: Rng;
  constructor(seed?: number) {
    this.rng = new SeededRng(seed ?? cryptoRandomBytes(4).readUInt32LE(0) >>> 0);
  }
  nowMs(): number {
    return performance.now();
  }
  wallMs(): number {
    return Date.now();
  }
  /** Delays past TIMER_STEP_MAX_MS (Node's limit: it fires longer ones after 1 ms) are re-armed in steps. */
  setTimer(delayMs: number, fn: () => void): TimerHandle {
    const dueMs = performance.now() + Math.max(0, delayMs);
    let h: ReturnType<typeof setTimeout>;
    const arm = (leftMs: number): void => {
      h = setTimeout(
        leftMs > TIMER_STEP_MAX_MS ? () => arm(dueMs - performance.now()) : fn,
        Math.min(leftMs, TIMER_STEP_MAX_MS),
      );
    };
    arm(Math.max(0, delayMs));
    return { cancel: () => clearTimeout(h) };
  }
  sleep(delayMs: number): Promise<void> {
    return new Promise((resolve) => this.setTimer(delayMs, resolve));
  }
  secureRandomBytes(n: number): Uint8Array {
    return new Uint8Array(cryptoRandomBytes(n));
  }
}

interface SimTimer {
  atMs: number;
  seq: number;
  fn: () => void;
  cancelled: boolean;
}

/**
 * Virtual time: the clock moves only when the simulator advances it. Timers fire in (time, creation)
 * order, so a run is a pure function of its seed.
 */
export class SimEnv implements Env {
  readonly rng: SeededRng;
  private clockMs = 0;
  private seq = 0;
  private timers: SimTimer[] = [];

  constructor(seed: number) {
    this.rng = new SeededRng(seed);
  }
  nowMs(): number {
    return this.clockMs;
  }
  wallMs(): number {
    return 1_700_000_000_000 + this.clockMs;
  }
  setTimer(delayMs: number, fn: () => void): TimerHandle {
    const t: SimTimer = { atMs: this.clockMs + Math.max(0, delayMs), seq: this.seq++, fn, cancelled: false };
    this.timers.push(t);
    return { cancel: () => void (t.cancelled = true) };
  }
  sleep(delayMs: number): Promise<void> {
    return new Promise((resolve) => this.setTimer(delayMs, resolve));
  }
  secureRandomBytes(n: number): Uint8Array {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = this.rng.nextU32() & 0xff;
    return out;
  }
  /** Time of the next pending timer, or null. */
  nextTimerMs(): number | null {
    let best: SimTimer | null = null;
    for (const t of this.timers) {
      if (t.cancelled) continue;
      if (best === null || t.atMs < best.atMs || (t.atMs === best.atMs && t.seq < best.seq)) best = t;
    }
    return best === null ? null : best.atMs;
  }
  /** Move the clock to `toMs` (never backwards) and fire every timer due by then, in order. */
  advanceTo(toMs: number): number {
    assert(toMs >= this.clockMs, `sim clock cannot go back (${toMs} < ${this.clockMs})`);
    let fired = 0;
    for (;;) {
      const due = this.timers
        .filter((t) => !t.cancelled && t.atMs <= toMs)
        .sort((a, b) => a.atMs - b.atMs || a.seq - b.seq)[0];
      if (!due) break;
      this.clockMs = Math.max(this.clockMs, due.atMs);
      due.cancelled = true;
      due.fn();
      fired++;
    }
    this.timers = this.timers.filter((t) => !t.cancelled);
    this.clockMs = toMs;
    return fired;
  }
}

/**
 * Await `p` while holding the event loop open. For promises settled by something that holds no ref on
 * the loop: Worker.terminate() settles on the worker's exit, but a terminating worker no longer holds
 * the loop open (even after ref()), so a caller awaiting only that could see its loop end first (node
 * exits 13, a test fails "still pending"; the simulator's stop-at-first-failure run with two threads
 * did so about 1 time in 4).
 */
export async function holdingLoopOpen<T>(p: Promise<T>): Promise<T> {
  const hold = setInterval(() => {}, 1 << 30);
  try {
    return await p;
  } finally {
    clearInterval(hold);
  }
}

/**
 * Resolves on the next turn of the event loop (after every tick and microtask queued so far, and after
 * Node reported the rejections nobody handled: the simulator's crash oracle, sim/crash_watch.ts).
 */
export function nextMacrotask(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}
