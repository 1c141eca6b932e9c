/**
 * Explorer: decides every nondeterministic choice of a simulated run (which ready op, NIC work
 * request, notification or scenario action goes next). A run is a pure function of (strategy, seed).
 *
 *   random  uniform among the enabled choices;
 *   pct     Probabilistic Concurrency Testing (Burckhardt et al.): a random priority per agent, the
 *           highest-priority enabled agent runs, and at d-1 random change points the running agent
 *           drops below every other (finds bugs of depth d with probability >= 1/(n k^(d-1)));
 *   dfs     bounded exhaustive search for tiny scenarios: seed n is read as mixed-radix digits, one
 *           per branching choice among the first `dfsDepth` of them (later ones take the first
 *           choice), so seeds 0, 1, 2 ... enumerate the schedules; `duplicate` marks a seed whose
 *           digits ran out before it was used up (the same schedule as a smaller seed);
 *   dpor    exhaustive search with partial-order reduction (dpor.ts, dpor_world.ts); a run of this
 *           explorer replays one schedule it found: `schedule` lists the index taken at each
 *           branching choice (later ones take the first).
 */
import { assert } from '../util/assert.ts';
import { SeededRng } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';

export const STRATEGIES = ['random', 'pct', 'dfs', 'dpor'] as const;
export type Strategy = (typeof STRATEGIES)[number];

export function isStrategy(s: string): s is Strategy {
  return (STRATEGIES as readonly string[]).includes(s);
}

/** What the explorer sees of a choice: a stable key and the agent that makes progress. */
export interface ChoiceInfo {
  /** Stable and deterministic, e.g. 'D.op#12', 'net#7', 'act:abort:3'. */
  key: string;
  /** PCT priorities are per agent: 'P.compute', 'D.nic', 'net:P>D', 'proxy'. */
  agent: string;
  /** Virtual time the choice takes (dpor checks sleep sets against the next timer). */
  costMs?: number;
}

export interface ExplorerOptions {
  pctDepth?: number;
  /** PCT: change points are drawn from the first this many choices (about one run's length). */
  pctSteps?: number;
  dfsDepth?: number;
  /** dpor replay: the index taken at each branching choice. */
  schedule?: readonly number[];
}

export interface Explorer {
  readonly strategy: Strategy;
  /** Index into `choices` (never empty, in a deterministic order). */
  pick(choices: readonly ChoiceInfo[]): number;
  /** dfs only: this seed's schedule equals a smaller seed's. */
  readonly duplicate: boolean;
  /** dpor search: the chosen step ran and the clock advanced past it, firing `timersFired` timers. */
  stepped?(timersFired: number): void;
  /** dpor search: nothing was enabled and the clock jumped to the next timer. */
  jumped?(): void;
  /** dpor search: the run stopped with these choices still enabled. */
  ended?(enabledKeys: string[]): void;
}

/** Independent streams from one seed (explorer, faults, world) so changing one does not shift another. */
export function streamSeed(seed: number, stream: number): number {
  return (Math.imul(seed >>> 0, 0x9e3779b1) ^ Math.imul(stream + 1, 0x85ebca6b)) >>> 0;
}

class RandomExplorer implements Explorer {
  readonly strategy = 'random' as const;
  readonly duplicate = false;
  private readonly rng: SeededRng;
  constructor(seed: number) {
    this.rng = new SeededRng(streamSeed(seed, 1));
  }
  pick(choices: readonly ChoiceInfo[]): number {
    return choices.length === 1 ? 0 : this.rng.int(choices.length);
  }
}

class PctExplorer implements Explorer {
  readonly strategy = 'pct' as const;
  readonly duplicate = false;
  private readonly rng: SeededRng;
  private readonly priorities = new Map<string, number>();
  private readonly changePoints: Map<number, number>;
  private readonly depth: number;
  private steps = 0;

  constructor(seed: number, depth: number, k: number) {
    assert(
      Number.isInteger(depth) && depth >= 1 && Number.isInteger(k) && k >= 1,
      'pct needs depth >= 1 and steps >= 1',
    );
    this.rng = new SeededRng(streamSeed(seed, 1));
    this.depth = depth;
    this.changePoints = new Map();
    // Change point i (1..d-1) lowers the running agent to priority i, below every initial one (>= d).
    // The d-1 steps are distinct (a step drawn twice is drawn again: else two change points collapse into one).
    for (let i = 1; i < Math.min(depth, k + 1); i++) {
      let step = this.rng.int(k);
      while (this.changePoints.has(step)) step = this.rng.int(k);
      this.changePoints.set(step, depth - i);
    }
  }

  private priority(agent: string): number {
    let p = this.priorities.get(agent);
    if (p === undefined) {
      p = this.depth + 1 + this.rng.next();
      this.priorities.set(agent, p);
    }
    return p;
  }

  pick(choices: readonly ChoiceInfo[]): number {
    let best = 0;
    for (let i = 1; i < choices.length; i++) {
      if (this.priority((choices[i] as ChoiceInfo).agent) > this.priority((choices[best] as ChoiceInfo).agent))
        best = i;
    }
    const drop = this.changePoints.get(this.steps++);
    if (drop !== undefined) this.priorities.set((choices[best] as ChoiceInfo).agent, drop);
    return best;
  }
}

class DfsExplorer implements Explorer {
  readonly strategy = 'dfs' as const;
  private rest: number;
  private branches = 0;
  constructor(
    seed: number,
    private readonly depth: number,
  ) {
    assert(Number.isSafeInteger(seed) && seed >= 0, 'dfs seeds are schedule numbers >= 0');
    this.rest = seed;
  }
  get duplicate(): boolean {
    return this.rest > 0;
  }
  pick(choices: readonly ChoiceInfo[]): number {
    if (choices.length === 1 || this.branches >= this.depth) return 0;
    this.branches++;
    const digit = this.rest % choices.length;
    this.rest = Math.floor(this.rest / choices.length);
    return digit;
  }
}

class ScheduleExplorer implements Explorer {
  readonly strategy = 'dpor' as const;
  readonly duplicate = false;
  private next = 0;
  constructor(private readonly schedule: readonly number[]) {}
  pick(choices: readonly ChoiceInfo[]): number {
    if (choices.length === 1) return 0;
    const i = this.schedule[this.next++] ?? 0;
    if (!(i < choices.length))
      throw new HandoffError('BAD_CONFIG', `--schedule index ${i} at a choice of ${choices.length}: not this world's`);
    return i;
  }
}

export function createExplorer(strategy: Strategy, seed: number, opts: ExplorerOptions = {}): Explorer {
  switch (strategy) {
    case 'random':
      return new RandomExplorer(seed);
    case 'pct':
      return new PctExplorer(seed, opts.pctDepth ?? 3, opts.pctSteps ?? 60);
    case 'dfs':
      return new DfsExplorer(seed, opts.dfsDepth ?? 12);
    case 'dpor':
      return new ScheduleExplorer(opts.schedule ?? []);
  }
}

/** PCT's k per request of a scenario (longest runs seen: xpyd 84 steps for 6 requests, tight-write 122 for 8). */
const PCT_STEPS_PER_REQUEST = 20;

/**
 * The options with PCT's k covering a run of `requests` requests, unless they set it: change points land
 * only on steps < k, and a run takes up to ~15 steps a request.
 */
export function withPctK(o: ExplorerOptions | undefined, requests: number): ExplorerOptions {
  const set = Object.fromEntries(Object.entries(o ?? {}).filter(([, v]) => v !== undefined)) as ExplorerOptions;
  return { pctSteps: PCT_STEPS_PER_REQUEST * requests, ...set };
}
