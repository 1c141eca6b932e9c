/**
 * Fault injection at named sites, FoundationDB BUGGIFY style: each site is switched on for a whole
 * run with probability 1/4 (drawn from the seed), and an enabled site fires with probability 1/4 each
 * time the simulator passes it. Everything comes from the seed, so a failing run replays exactly.
 */
import { SeededRng } from '../util/env.ts';
import { streamSeed } from './explorer.ts';

export const FAULT_SITES = [
  'delay-zero',
  'slow-read',
  'fail-read',
  'drop-notify',
  'dup-notify',
  'kill-peer',
  'abort-mid-transfer',
  'preempt',
  'late-answer',
  'split-transfer',
] as const;
export type FaultSite = (typeof FAULT_SITES)[number];

/**
 * Sites added after the bug zoo's seed bounds were measured, each with a stream of its own: the sites
 * above draw exactly as before. `late-answer`: prefill's READ answer reaches the proxy late, close to the
 * end of its lease, so decode's READ may still be queued when the lease ends (session 11).
 * `split-transfer`: for the whole run, each READ and WRITE goes as several work requests of 1-3 ranges
 * (a long prompt's split, DESCRIPTORS_MAX, is otherwise never reached with the simulator's short prompts).
 */
const OWN_STREAMS: Partial<Record<FaultSite, number>> = { 'late-answer': 11, 'split-transfer': 12 };

export class Buggify {
  private readonly rng: SeededRng;
  private readonly on: Set<FaultSite>;
  private readonly own = new Map<FaultSite, SeededRng>();
  readonly fired: Partial<Record<FaultSite, number>> = {};

  /** `enabled` false: no site ever fires (dfs explores orderings only). */
  constructor(seed: number, enabled: boolean, sites: readonly FaultSite[] = FAULT_SITES) {
    this.rng = new SeededRng(streamSeed(seed, 2));
    const shared = sites.filter((s) => OWN_STREAMS[s] === undefined);
    this.on = new Set(enabled ? shared.filter(() => this.rng.next() < 0.25) : []);
    for (const site of sites) {
      const stream = OWN_STREAMS[site];
      if (stream === undefined) continue;
      const rng = new SeededRng(streamSeed(seed, stream));
      this.own.set(site, rng);
      if (enabled && rng.next() < 0.25) this.on.add(site);
    }
  }

  isOn(site: FaultSite): boolean {
    return this.on.has(site);
  }

  /** Passes site `site`: true when the fault fires now. */
  fire(site: FaultSite, probability = 0.25): boolean {
    if (!this.on.has(site) || (this.own.get(site) ?? this.rng).next() >= probability) return false;
    this.fired[site] = (this.fired[site] ?? 0) + 1;
    return true;
  }

  /** A value drawn from the fault stream (how long a delay lasts, which page count); `site`: its own stream. */
  int(n: number, site?: FaultSite): number {
    return ((site === undefined ? undefined : this.own.get(site)) ?? this.rng).int(n);
  }

  /**
   * An instance's side under the split-transfer fault: its connector posts work requests of 1-3 ranges
   * (drawn once per instance). Off: the side unchanged. Not counted as fired: it may fail no request.
   */
  splitTransfers<S extends { connector: { rangesPerWorkRequest?: number } }>(side: S): S {
    if (!this.isOn('split-transfer')) return side;
    return { ...side, connector: { ...side.connector, rangesPerWorkRequest: 1 + this.int(3, 'split-transfer') } };
  }

  get enabledSites(): FaultSite[] {
    return [...this.on];
  }
}
