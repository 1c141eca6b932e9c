/**
 * SimWorld: a whole 1P1D deployment in one process on virtual time. Prefill and decode are real
 * LLMEngines (scheduler, runner, model, OneSidedConnector unmodified) on sim devices with race
 * checkers, joined by the `sim` transfer backend; the proxy's flow drives them. Nothing moves by
 * itself: each step the world lets every microtask settle, collects the enabled choices
 *
 *   ready compute op per instance | queued NIC work request | queued notification/handshake | action
 *
 * and the explorer picks one. The clock advances by the choice's cost (cost_model.ts), or jumps to
 * the next timer when nothing is enabled. A run is a pure function of (scenario, preset, strategy,
 * seed, mutant): the replay of a failure is the same command.
 */
import { SimEnv } from '../util/env.ts';
import { formatRace, type RaceReport } from '../device/race/race_report.ts';
import type { KVCacheBlock } from '../kv/block_pool.ts';
import type { ModelPreset } from '../kv/presets.ts';
import { SimFabric, type FabricFault, type FabricItem } from '../transfer/sim/sim_fabric.ts';
import { Buggify } from './buggify.ts';
import { forwardCostMs, nicCostMs, zeroCostMs, COST } from './cost_model.ts';
import { createExplorer, withPctK, type ChoiceInfo, type Explorer } from './explorer.ts';
import type { ExplorerOptions, Strategy } from './explorer.ts';
import { SimInstance, type OpInfo } from './instance.ts';
import type { Invariant, LifecycleViolation } from '../kv/page_lifecycle.ts';
import { SimProxy, type ProxyRequest } from './proxy.ts';
import { OrderCoverage } from './coverage.ts';
import { buildScenario, type ScenarioConfig, type ScenarioName, type ScenarioOptions } from './scenarios.ts';
import { TraceRecorder, type LaneKind, type SimTrace } from './trace.ts';
import { WorldEvents } from './world_events.ts';
import { CancelPoints } from './cancel_points.ts';
import { CancelOracles } from './cancel_oracles.ts';
import { XpydRouting } from './xpyd.ts';
import { advanceGuarded, guarded, plantCrashProbe, watchingRejections, type CrashProbe } from './crash_watch.ts';

export type OracleName =
  'race' | 'lifecycle' | 'pd-equals-colocated' | 'liveness' | 'leak' | 'crash' | 'lease' | 'cancel' | 'router-index';

export interface Violation {
  oracle: OracleName;
  invariant?: Invariant;
  message: string;
  step: number;
  atMs: number;
}

/** A world: its scenario and what the run sets of it (ScenarioOptions: requests, mutant, page sizes, TP, loads). */
export interface WorldOptions extends ScenarioOptions {
  scenario: ScenarioName;
  preset: ModelPreset;
  seed: number;
  strategy: Strategy;
  /** BUGGIFY fault sites (default: on, except for dfs, which explores orderings only). */
  faults?: boolean;
  maxSteps?: number;
  maxVirtualMs?: number;
  explorer?: ExplorerOptions;
  trace?: boolean;
  /** Stop at the first violation (default); a trace run goes on to show what followed. */
  stopOnViolation?: boolean;
  /** Build the explorer from the world (dpor search: footprints need the world); else createExplorer. */
  makeExplorer?: (w: SimWorld) => Explorer;
  crashProbe?: CrashProbe;
}

interface Choice extends ChoiceInfo {
  costMs: number;
  process: string;
  lane: LaneKind | 'proxy';
  name: string;
  args: Record<string, unknown>;
  apply(): void;
}

export interface Action {
  key: string;
  name: string;
  enabled(): boolean;
  run(): void;
}

export const DEFAULT_MAX_STEPS = 20_000;
export const DEFAULT_MAX_VIRTUAL_MS = 20_000;

/** dfs numbers the schedules of world 0; dpor explores world `seed` (its schedules are numbered apart). */
const worldSeed = (o: WorldOptions): number => (o.strategy === 'dfs' ? 0 : o.seed);

const settle = (): Promise<void> => new Promise((resolve) => process.nextTick(resolve));

export class SimWorld {
  readonly env: SimEnv;
  readonly fabric = new SimFabric(false);
  readonly explorer: Explorer;
  readonly buggify: Buggify;
  readonly trace: TraceRecorder | null;
  readonly violations: Violation[] = [];
  readonly actions = new Map<string, Action>();
  /** Zero ops a fault holds back until this step (delay-zero). */
  readonly delayedZeros = new Map<string, number>();
  ballast: { blocks: KVCacheBlock[]; releaseAtStep: number } | null = null;
  P!: SimInstance;
  D!: SimInstance;
  /** xpyd: the other instances (and restarted ones) and the KV-aware router over all of them. */
  readonly extra: SimInstance[] = [];
  xpyd: XpydRouting | null = null;
  proxy!: SimProxy;
  coverage!: OrderCoverage;
  cancels!: CancelPoints;
  cancelOracles!: CancelOracles;
  step = 0;
  private events!: WorldEvents;
  private hash = 0x811c9dc5;
  private readonly races: Array<{ inst: string; r: RaceReport }> = [];
  private running = true;

  private constructor(
    readonly opts: WorldOptions,
    readonly scenario: ScenarioConfig,
  ) {
    // dfs numbers schedules of one fixed world; the other strategies draw the world from the seed too.
    this.env = new SimEnv(worldSeed(opts));
    const k = withPctK(opts.explorer, scenario.requests.length);
    this.explorer = opts.makeExplorer?.(this) ?? createExplorer(opts.strategy, opts.seed, k);
    this.buggify = new Buggify(opts.seed, opts.faults ?? (opts.strategy !== 'dfs' && opts.strategy !== 'dpor'));
    this.trace = opts.trace ? new TraceRecorder() : null;
  }

  static async create(opts: WorldOptions): Promise<SimWorld> {
    const scenario = buildScenario(opts.scenario, opts.preset, worldSeed(opts), opts);
    const w = new SimWorld(opts, scenario);
    const observer = { opEnqueued: (inst: SimInstance, id: number, info: OpInfo) => w.opEnqueued(inst, id, info) };
    const onViolation = (name: string) => (v: LifecycleViolation) => w.lifecycleViolation(name, v);
    const common = {
      preset: scenario.preset,
      modelSeed: scenario.modelSeed,
      idlePollMs: scenario.idlePollMs,
      notifyTimeoutMs: scenario.notifyTimeoutMs,
    };
    const build = (name: string, role: 'producer' | 'consumer'): Promise<SimInstance> => {
      const side = w.buggify.splitTransfers(role === 'producer' ? scenario.prefill : scenario.decode);
      return SimInstance.create({ ...common, ...side, name, role }, w.env, w.fabric, observer, onViolation(name));
    };
    w.P = await build('P', 'producer');
    w.D = await build('D', 'consumer');
    w.proxy = new SimProxy(
      scenario.requests,
      w.P,
      w.D,
      scenario.mode,
      () => w.env.nowMs(),
      (r, what) => w.proxyEvent(r, what),
      (r, deliver) => (scenario.answerHop ? w.cancels.hop(r, deliver) : w.events.answerArrives(r, deliver)),
      scenario.xpyd ? (r) => (w.xpyd as XpydRouting).route(r) : null,
    );
    if (scenario.xpyd) w.xpyd = await XpydRouting.create(w, scenario.xpyd, build);
    w.cancels = new CancelPoints(w);
    w.cancels.install();
    w.cancelOracles = new CancelOracles(w, w.cancels);
    w.events = new WorldEvents(w);
    w.coverage = new OrderCoverage(w);
    w.fabric.onEvent((ev) => w.events.handle(ev));
    plantCrashProbe(w.env, opts.seed, opts.crashProbe);
    return w;
  }

  instanceOf(engineId: string): SimInstance | null {
    return this.instances.find((i) => i.engineId === engineId) ?? null;
  }

  get instances(): SimInstance[] {
    return [this.P, this.D, ...this.extra];
  }

  violate(oracle: OracleName, message: string, invariant?: Invariant): void {
    if (!this.running) return;
    this.violations.push({
      oracle,
      message,
      step: this.step,
      atMs: this.env.nowMs(),
      ...(invariant ? { invariant } : {}),
    });
  }

  private readonly crash = (message: string): void => this.violate('crash', message);

  private lifecycleViolation(instance: string, v: LifecycleViolation): void {
    const inst = this.instances.find((i) => i.name === instance);
    if (inst !== undefined && !inst.alive) return; // a dead instance's memory no longer matters
    this.violate('lifecycle', `${v.invariant}: ${v.message}`, v.invariant);
    this.trace?.instant({
      process: instance,
      lane: 'host',
      name: `violation ${v.invariant}`,
      atMs: this.env.nowMs(),
      args: { message: v.message },
    });
  }

  private proxyEvent(r: ProxyRequest, what: string): void {
    this.trace?.instant({
      process: 'proxy',
      lane: 'proxy',
      name: `request ${r.spec.index}: ${what}`,
      atMs: this.env.nowMs(),
      args: {},
    });
  }

  private opEnqueued(inst: SimInstance, opId: number, info: OpInfo): void {
    const key = `${inst.name}.op#${opId}`;
    this.trace?.instant({
      process: inst.name,
      lane: 'host',
      name: `enqueue ${info.what}`,
      atMs: this.env.nowMs(),
      args: { key, step: info.step, requests: info.requestIds },
    });
    if ((info.kind === 'zero' || info.kind === 'zero-spans') && this.buggify.fire('delay-zero'))
      this.delayedZeros.set(key, this.step + 1 + this.buggify.int(40));
    if (
      inst === this.D &&
      info.kind === 'kernel' &&
      this.ballast === null &&
      !this.actions.has('act:ballast') &&
      this.buggify.fire('preempt', 0.1)
    ) {
      this.addAction({
        key: 'act:ballast',
        name: 'take decode pages (memory pressure)',
        enabled: () => this.D.alive,
        run: () => this.takeBallast(),
      });
    }
  }

  addAction(a: Action): void {
    this.actions.set(a.key, a);
  }

  /** Memory pressure (the preempt fault): hold half of decode's free pages for a while. */
  private takeBallast(): void {
    const pool = this.D.engine.kv.blockPool;
    const n = Math.floor(pool.getNumFreeBlocks() / 2);
    if (n === 0) return;
    this.ballast = { blocks: pool.getNewBlocks(n), releaseAtStep: this.step + 5 + this.buggify.int(60) };
    this.addAction({
      key: 'act:ballast-release',
      name: 'release decode pages',
      enabled: () => this.ballast !== null && this.step >= this.ballast.releaseAtStep,
      run: () => this.releaseBallast(),
    });
  }

  private releaseBallast(): void {
    if (this.ballast === null) return;
    this.D.engine.kv.blockPool.freeBlocks([...this.ballast.blocks].reverse());
    this.ballast = null;
  }

  private opCost(info: OpInfo | undefined): number {
    if (info === undefined) return COST.actionMs;
    if (info.kind === 'kernel') return forwardCostMs(info.tokens);
    if (info.kind === 'zero' || info.kind === 'zero-spans') return zeroCostMs(info.pages);
    if (info.kind === 'copy') return COST.copyPerPageMs * info.pages;
    return 0;
  }

  private choices(): Choice[] {
    const out: Choice[] = [];
    const held: Choice[] = [];
    for (const inst of this.instances) {
      if (!inst.alive) continue;
      for (const r of inst.device.readyOps()) {
        const info = inst.ops.get(r.id);
        const key = `${inst.name}.op#${r.id}`;
        // With tensor parallel ranks a zero or copy runs per rank: one choice (and one agent) per rank part.
        const rank = r.rank === null ? '' : `.r${r.rank}`;
        const c: Choice = {
          key: `${key}${rank}`,
          agent: `${inst.name}.compute${rank}`,
          costMs: this.opCost(info),
          process: inst.name,
          lane: 'compute',
          name: info?.what ?? r.label.what,
          args: {
            step: info?.step ?? null,
            requests: info?.requestIds ?? [],
            tokens: info?.tokens ?? 0,
            pages: info?.pages ?? 0,
          },
          apply: () => inst.runOp(r.id, r.rank),
        };
        if ((this.delayedZeros.get(key) ?? -1) > this.step) held.push(c);
        else out.push(c);
      }
    }
    const now = this.env.nowMs();
    const items = this.fabric.enabled(now);
    // The clock sums the choices' costs: picking one instance's compute again and again would age a message
    // that really travels meanwhile. Past COST.netWaitMaxMs it goes first, so none times out without a fault.
    const overdue = items.filter((item) => now - item.notBeforeMs >= COST.netWaitMaxMs);
    if (overdue.length > 0) return overdue.map((item) => this.itemChoice(item));
    for (const item of items) out.push(this.itemChoice(item));
    for (const a of this.actions.values()) if (a.enabled()) out.push(this.actionChoice(a));
    if (out.length > 0) return out;
    if (held.length > 0) return held;
    // Nothing else can run: memory pressure must not outlive the work it delays.
    const release = this.actions.get('act:ballast-release');
    if (release !== undefined && this.ballast !== null) return [this.actionChoice(release)];
    return [];
  }

  private actionChoice(a: Action): Choice {
    return {
      key: a.key,
      agent: 'proxy',
      costMs: COST.actionMs,
      process: 'proxy',
      lane: 'proxy',
      name: a.name,
      args: {},
      apply: () => {
        this.actions.delete(a.key);
        a.run();
      },
    };
  }

  private itemChoice(item: FabricItem): Choice {
    const from = this.instanceOf(item.from)?.name ?? item.from;
    const to = this.instanceOf(item.to)?.name ?? item.to;
    const wr = item.kind === 'read' || item.kind === 'write';
    return {
      key: `net#${item.id}`,
      agent: wr ? `${from}.nic` : `net:${from}>${to}`,
      costMs: nicCostMs(item.kind, item.bytes),
      process: from,
      lane: 'nic',
      name: wr ? `${item.kind} ${item.label.requestIds?.join(',') ?? ''}`.trim() : `${item.label.what} → ${to}`,
      args: { transferId: item.transferId, bytes: item.bytes, to },
      apply: () => {
        let fault: FabricFault | null = null;
        if (item.kind === 'read' && this.buggify.fire('fail-read')) fault = 'fail';
        if (item.kind === 'notify' && this.buggify.fire('drop-notify')) fault = 'drop';
        else if (item.kind === 'notify' && this.buggify.fire('dup-notify')) fault = 'duplicate';
        this.fabric.run(item.id, fault);
      },
    };
  }

  private isDone(): boolean {
    if (!this.proxy.allDone || this.ballast !== null || this.fabric.queued().length > 0) return false;
    return this.instances.every((i) => !i.alive || (i.engine.core.isIdle() && i.device.pendingItems() === 0));
  }

  private checkRacesAndCrashes(): void {
    for (const inst of this.instances) {
      const all = inst.device.raceChecker?.races() ?? [];
      const seen = this.races.filter((x) => x.inst === inst.name).length;
      for (const r of all.slice(seen)) {
        this.violate('race', `${inst.name}: ${formatRace(r)}`);
        this.races.push({ inst: inst.name, r });
      }
    }
    for (const inst of this.instances) {
      const crashed = inst.engine.core.crashed;
      if (inst.alive && crashed !== null && !this.violations.some((v) => v.oracle === 'crash'))
        this.violate('crash', `${inst.name}: engine loop crashed: ${crashed.message}`);
    }
    const flowCrash = this.proxy.crashed;
    if (flowCrash !== null && !this.violations.some((v) => v.oracle === 'crash'))
      this.violate('crash', `proxy flow: assertion failed: ${flowCrash.message}`);
  }

  /** Run to the end (all finished, instances quiescent) or the first violation: crash_watch.ts for the crashes. */
  run(): Promise<void> {
    return watchingRejections(() => this.explore(), this.crash);
  }

  private async explore(): Promise<void> {
    const maxSteps = this.opts.maxSteps ?? DEFAULT_MAX_STEPS;
    const maxVirtualMs = this.opts.maxVirtualMs ?? DEFAULT_MAX_VIRTUAL_MS;
    for (const r of this.proxy.requests) this.env.setTimer(r.spec.arrivalMs, () => this.proxy.arrive(r));
    for (;;) {
      await settle();
      this.checkRacesAndCrashes();
      this.cancelOracles.afterStep();
      this.xpyd?.afterStep();
      if ((this.violations.length > 0 && this.opts.stopOnViolation !== false) || this.isDone()) {
        this.explorer.ended?.(this.choices().map((c) => c.key));
        break;
      }
      if (this.step >= maxSteps) {
        this.violate('liveness', `step budget of ${maxSteps} choices exhausted; ${this.pendingSummary()}`);
        break;
      }
      const now = this.env.nowMs();
      if (now > maxVirtualMs) {
        this.violate('liveness', `virtual time budget of ${maxVirtualMs} ms exhausted; ${this.pendingSummary()}`);
        break;
      }
      const choices = this.choices();
      if (choices.length === 0) {
        const next = [this.env.nextTimerMs(), this.fabric.nextEnabledMs(now)].filter((t): t is number => t !== null);
        if (next.length === 0) {
          this.violate('liveness', `deadlock: nothing enabled and no timer pending; ${this.pendingSummary()}`);
          break;
        }
        advanceGuarded(this.env, this.crash, Math.max(now, Math.min(...next)));
        this.explorer.jumped?.();
        continue;
      }
      const c = choices[this.explorer.pick(choices)] as Choice;
      for (let i = 0; i < c.key.length; i++) this.hash = Math.imul(this.hash ^ c.key.charCodeAt(i), 0x01000193) >>> 0;
      guarded(this.crash, `applying ${c.key}`, () => c.apply());
      this.trace?.span({
        key: c.key,
        process: c.process,
        lane: c.lane,
        name: c.name,
        startMs: now,
        durMs: c.costMs,
        args: c.args,
      });
      this.step++;
      const fired = advanceGuarded(this.env, this.crash, now + c.costMs);
      this.explorer.stepped?.(fired);
    }
  }

  pendingSummary(): string {
    const open = this.proxy.requests.filter((r) => r.phase !== 'done').map((r) => `${r.spec.index}:${r.phase}`);
    const busy = this.instances.filter((i) => i.alive && !i.engine.core.isIdle()).map((i) => i.name);
    const ballast =
      this.ballast === null ? '' : `, ${this.ballast.blocks.length} decode pages held by the preempt fault`;
    return `open requests [${open.join(' ')}], busy instances [${busy.join(' ')}], fabric items ${this.fabric.queued().length}${ballast}`;
  }

  /** Stop reporting (the run is judged) and shut the live instances down, bounded. */
  async shutdown(): Promise<void> {
    this.running = false;
    if (this.violations.length > 0) return; // abandon: pending device work would never run
    let closed = false;
    void Promise.all(this.instances.map((i) => i.close())).then(
      () => (closed = true),
      () => (closed = true),
    );
    // A loop that was awaiting an empty step when stopped sleeps one idle poll first: run the clock.
    for (let k = 0; k < 1000 && !closed; k++) {
      await settle();
      const next = this.env.nextTimerMs();
      if (!closed && next !== null) this.env.advanceTo(Math.max(next, this.env.nowMs()));
    }
  }

  get choiceHash(): string {
    return this.hash.toString(16).padStart(8, '0');
  }

  toTrace(title: string): SimTrace | null {
    if (this.trace === null) return null;
    // One highlight per racing pair of accesses, naming every page they both touch.
    const pairs = new Map<string, { inst: string; r: RaceReport; blocks: Set<number> }>();
    for (const { inst, r } of this.races) {
      const key = `${inst}|${r.a.source}${r.a.id}|${r.b.source}${r.b.id}`;
      const p = pairs.get(key) ?? { inst, r, blocks: new Set<number>() };
      p.blocks.add(r.block);
      pairs.set(key, p);
    }
    for (const p of pairs.values())
      this.events.markRace(
        p.inst,
        p.r,
        [...p.blocks].sort((a, b) => a - b),
      );
    const requests = this.proxy.requests.map((r) => ({
      index: r.spec.index,
      startMs: r.startMs ?? r.spec.arrivalMs,
      endMs: r.endMs ?? this.env.nowMs(),
      outcome: r.outcome === null ? 'unfinished' : r.outcome.ok ? 'ok' : `failed ${r.outcome.errorCode ?? 'untyped'}`,
    }));
    return this.trace.toTrace(title, requests);
  }
}
