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
] as const;
export type FaultSite = (typeof FAULT_SITES)[number];

export class Buggify {
  private readonly rng: SeededRng;
  private readonly on: Set<FaultSite>;
  readonly fired: Partial<Record<FaultSite, number>> = {};

  /** `enabled` false: no site ever fires (dfs explores orderings only). */
  constructor(seed: number, enabled: boolean, sites: readonly FaultSite[] = FAULT_SITES) {
    this.rng = new SeededRng(streamSeed(seed, 2));
    this.on = new Set(enabled ? sites.filter(() => this.rng.next() < 0.25) : []);
  }

  isOn(site: FaultSite): boolean {
    return this.on.has(site);
  }

  /** Passes site `site`: true when the fault fires now. */
  fire(site: FaultSite, probability = 0.25): boolean {
    if (!this.on.has(site) || this.rng.next() >= probability) return false;
    this.fired[site] = (this.fired[site] ?? 0) + 1;
    return true;
  }

  /** A value drawn from the fault stream (how long a delay lasts, which page count). */
  int(n: number): number {
    return this.rng.int(n);
  }

  get enabledSites(): FaultSite[] {
    return [...this.on];
  }
}
