/**
 * The xpyd world's router: the real KvRouter and RouterIndex (serve/) over 2 prefill + 2 decode sim
 * instances, fed by each instance's real KV event publisher through a simulated channel:
 *
 *   publisher ──batch──> [ delivery actions: the explorer picks the order (reorders) ] ──> index
 *                          a delivery may lose its batch, or deliver it again later (duplicates)
 *   lagging index, nothing in flight ──> heartbeat action ──> (gap) dump ──> index
 *   one decode restarts once it is idle: a new instance (a new event epoch) behind the same member
 *
 * The router-index oracle ('router-index'):
 *   - whenever the index has caught up with an instance (same epoch, every batch up to the publisher's
 *     seq applied, nothing pending), its set for that instance equals the pool's cached-hash set;
 *   - a routing decision taken on a caught-up index never counts a page the pool no longer holds
 *     (decisions on a lagging index are counted as stale, not judged: the instance checks its own
 *     cache, so a stale belief costs compute, never correctness: pd-equals-colocated judges that);
 *   - at the end, after the final heartbeats and dumps, every live instance's set equals its pool's.
 */
import { SeededRng } from '../util/env.ts';
import type { KvEventBatch } from '../kv/kv_events.ts';
import { InstancePool, type PoolMember } from '../serve/instance_pool.ts';
import type { InstanceInfo } from '../serve/instance_server.ts';
import { KvRouter, PromptChains, type RouteDecision } from '../serve/kv_router.ts';
import { RouterIndex } from '../serve/router_index.ts';
import { streamSeed } from './explorer.ts';
import type { SimInstance } from './instance.ts';
import type { ProxyRequest, SimRoute } from './proxy.ts';
import type { XpydScenario } from './scenarios.ts';
import type { SimWorld } from './world.ts';

export type BuildInstance = (name: string, role: 'producer' | 'consumer') => Promise<SimInstance>;

/** Chance that a delivery loses its batch, and that it is delivered once more later. */
const DROP_P = 0.15;
const DUP_P = 0.15;
/** A delivery waits up to this many world steps. */
const DELAY_STEPS_MAX = 40;

export class XpydRouting {
  readonly index: RouterIndex;
  readonly router: KvRouter;
  readonly pools: { prefill: InstancePool; decode: InstancePool };
  /** The instance behind each member URL (a restart puts a new one behind the same URL). */
  private readonly behind = new Map<string, SimInstance>();
  private readonly queued = new Map<string, number>();
  /** The publisher position each member was last heartbeaten at (one heartbeat per position). */
  private readonly beaten = new Map<string, string>();
  private readonly rng: SeededRng;
  private restarting: string | null = null;
  private nextKey = 0;
  stats = {
    batches: 0,
    delivered: 0,
    dropped: 0,
    duplicated: 0,
    dumps: 0,
    restarts: 0,
    decodeOnly: 0,
    stale: 0,
    decodeOnlyStale: 0,
  };

  private constructor(
    private readonly w: SimWorld,
    private readonly cfg: XpydScenario,
    private readonly build: BuildInstance,
    private readonly faults: boolean,
  ) {
    this.index = new RouterIndex({
      maxPending: 4,
      maxHashesPerInstance: 1 << 20,
      ...(w.opts.mutant ? { mutant: w.opts.mutant } : {}),
    });
    this.router = new KvRouter(this.index, { kvWeight: cfg.kvWeight, skipPrefillMaxTokens: cfg.skipPrefillMaxTokens });
    const urls = (prefix: string, n: number): string[] =>
      Array.from({ length: n }, (_, i) => `sim://${prefix}${i === 0 ? '' : i}`);
    this.pools = {
      prefill: new InstancePool('prefill', urls('P', cfg.prefills), 'kv-aware'),
      decode: new InstancePool('decode', urls('D', cfg.decodes), 'kv-aware'),
    };
    this.rng = new SeededRng(streamSeed(w.opts.seed, 7));
  }

  /** The extra instances (P1.., D1..) next to the world's P and D, each one's events wired to the index. */
  static async create(w: SimWorld, cfg: XpydScenario, build: BuildInstance): Promise<XpydRouting> {
    const faults = w.opts.faults ?? (w.opts.strategy !== 'dfs' && w.opts.strategy !== 'dpor');
    const x = new XpydRouting(w, cfg, build, faults);
    for (const [pool, first, role] of [
      [x.pools.prefill, w.P, 'producer'],
      [x.pools.decode, w.D, 'consumer'],
    ] as const) {
      for (const [i, m] of pool.members.entries()) {
        const inst = i === 0 ? first : await build(m.url.slice('sim://'.length), role);
        if (i > 0) w.extra.push(inst);
        x.attach(m, inst);
      }
    }
    return x;
  }

  private attach(m: PoolMember, inst: SimInstance): void {
    this.behind.set(m.url, inst);
    const pool = inst.spec.role === 'producer' ? this.pools.prefill : this.pools.decode;
    pool.markUp(m, infoOf(inst));
    inst.engine.kvEvents.subscribe((b) => this.enqueue(m.url, b));
  }

  /** A batch leaves the instance: it reaches the router when the explorer delivers it (or never). */
  private enqueue(url: string, batch: KvEventBatch, again = false): void {
    if (!again) this.stats.batches++;
    this.queued.set(url, (this.queued.get(url) ?? 0) + 1);
    const key = `act:kv#${this.nextKey++}`;
    // Network latency in steps: batches of one instance overtake each other (a reorder) when it varies.
    const readyAt = this.w.step + (this.faults ? this.rng.int(DELAY_STEPS_MAX) : 0);
    this.w.addAction({
      key,
      name: `KV events ${url.slice(6)} seq ${batch.seq}${again ? ' (again)' : ''}`,
      enabled: () => this.w.step >= readyAt,
      run: () => this.deliver(url, batch),
    });
  }

  private deliver(url: string, batch: KvEventBatch): void {
    this.queued.set(url, (this.queued.get(url) ?? 1) - 1);
    if (this.faults && this.rng.next() < DROP_P) {
      this.stats.dropped++;
      return;
    }
    this.stats.delivered++;
    this.index.applyBatch(url, batch);
    if (this.index.needsDump(url)) this.dump(url);
    if (this.faults && this.rng.next() < DUP_P) {
      this.stats.duplicated++;
      this.enqueue(url, batch, true);
    }
  }

  private dump(url: string): void {
    const inst = this.behind.get(url);
    if (inst === undefined || !inst.alive) return;
    this.index.applyDump(url, inst.engine.kvEvents.dump());
    this.stats.dumps++;
  }

  /** The index holds exactly what the instance published (same epoch, same seq, nothing pending). */
  caughtUp(url: string): boolean {
    const inst = this.behind.get(url);
    const p = this.index.position(url);
    const pub = inst?.engine.kvEvents;
    return pub !== undefined && p.epoch === pub.epoch && p.seq === pub.seq && p.pending === 0;
  }

  /** SimProxy's route: decode first, by the index; the oracle judges what it counted. */
  route = (r: ProxyRequest): SimRoute => {
    for (const pool of [this.pools.prefill, this.pools.decode]) for (const m of pool.members) this.refresh(pool, m);
    const d = this.router.route(this.pools, r.spec.promptTokenIds);
    if (d === null) return { prefill: this.w.P, decode: this.w.D }; // nobody healthy: the dead answer
    this.judgeDecision(r, d);
    if (d.prefill === null) this.stats.decodeOnly++;
    const inst = (m: PoolMember): SimInstance => this.behind.get(m.url) as SimInstance;
    return { prefill: d.prefill === null ? null : inst(d.prefill), decode: inst(d.decode) };
  };

  private refresh(pool: InstancePool, m: PoolMember): void {
    const inst = this.behind.get(m.url);
    if (inst === undefined || !inst.alive || this.restarting === m.url) return pool.markDown(m, 'down');
    pool.markUp(m);
    const s = inst.engine.scheduler;
    m.inflight = this.w.proxy.requests.filter(
      (q) => q.phase !== 'done' && (q.route?.decode === inst || q.route?.prefill === inst),
    ).length;
    m.load = {
      running: s.numRunning,
      waiting: s.numWaiting,
      held_for_send: s.numHeldForSend,
      held_for_send_pages: s.transfers.numHeldPages,
      free_pages: inst.engine.kv.getNumFreeBlocks(),
      total_pages: inst.kvConfig.numBlocks - 1,
    };
  }

  /** Every hash counted for a hit must still be in that pool, when the index was caught up. */
  private judgeDecision(r: ProxyRequest, d: RouteDecision): void {
    const chains = new PromptChains(r.spec.promptTokenIds);
    const claims: Array<[PoolMember | null, number]> = [
      [d.decode, d.decodeHitTokens],
      [d.prefill, d.prefillHitTokens],
    ];
    for (const [m, hit] of claims) {
      if (m === null || hit === 0 || m.info === null) continue;
      const inst = this.behind.get(m.url) as SimInstance;
      const bs = m.info.block_size;
      const gone = m.info.prefix_cache_groups.flatMap((g) =>
        Array.from({ length: hit / bs }, (_, i) => chains.hash(bs, g, i)).filter(
          (h) => inst.engine.kv.blockPool.getCachedBlock(h) === null,
        ),
      );
      if (gone.length === 0) continue;
      // Decode-only on pages decode lost: it prefills the prompt itself (pd-equals-colocated judges the answer).
      if (d.prefill === null) this.stats.decodeOnlyStale++;
      if (!this.caughtUp(m.url)) this.stats.stale++;
      else
        this.w.violate(
          'router-index',
          `request ${r.spec.index} routed to ${inst.name} for ${hit} cached tokens, but ${gone.length} of those pages are gone (the index was caught up)`,
        );
    }
  }

  /** After each step: the consistency half of the oracle, heartbeats for lagging members, the restart. */
  afterStep(): void {
    for (const [url, inst] of this.behind) {
      if (!inst.alive) continue;
      const at = `${inst.engine.kvEvents.epoch}#${inst.engine.kvEvents.seq}`;
      if (this.caughtUp(url)) this.judgeSets(url, inst, 'caught up');
      else if ((this.queued.get(url) ?? 0) === 0 && this.beaten.get(url) !== at) {
        this.beaten.set(url, at);
        this.w.addAction({
          key: `act:kvhb:${url}`,
          name: `KV heartbeat ${url.slice(6)}`,
          enabled: () => true,
          run: () => this.heartbeat(url),
        });
      }
    }
    this.offerRestart();
  }

  private heartbeat(url: string): void {
    const inst = this.behind.get(url);
    if (inst === undefined || !inst.alive) return;
    const pub = inst.engine.kvEvents;
    if (this.index.heartbeat(url, pub.epoch, pub.seq)) this.dump(url);
  }

  private judgeSets(url: string, inst: SimInstance, when: string): void {
    const mine = this.index.hashesOf(url);
    const pool = inst.engine.kv.blockPool.cachedHashes();
    const missing = pool.filter((h) => !mine.has(h)).length;
    const extra = mine.size - (pool.length - missing);
    if (extra === 0 && missing === 0) return;
    this.w.violate(
      'router-index',
      `${when}: the index for ${inst.name} has ${extra} hashes its pool does not hold and lacks ${missing} it does`,
    );
  }

  /** One decode restarts (a new instance, a new epoch, an empty cache) once nothing is routed to it. */
  private offerRestart(): void {
    const m = this.pools.decode.members[this.cfg.restartDecode];
    if (m === undefined || this.stats.restarts > 0 || this.w.actions.has('act:restart')) return;
    const inst = this.behind.get(m.url) as SimInstance;
    const done = this.w.proxy.requests.filter((q) => q.phase === 'done').length;
    const busy = this.w.proxy.requests.some(
      (q) => q.phase !== 'done' && (q.route?.decode === inst || q.route?.prefill === inst),
    );
    if (!inst.alive || done < 2 || busy || !inst.engine.core.isIdle()) return;
    this.w.addAction({
      key: 'act:restart',
      name: `restart ${inst.name}`,
      enabled: () => inst.engine.core.isIdle() && this.restarting === null,
      run: () => this.restart(m, inst),
    });
  }

  private restart(m: PoolMember, old: SimInstance): void {
    this.stats.restarts++;
    this.restarting = m.url;
    old.kill();
    this.w.proxy.instanceDied(old); // a request routed to it meanwhile fails over (pdFlow) or fails typed
    this.w.addAction({
      key: 'act:restart-wait',
      name: `${old.name} starting again`,
      enabled: () => this.restarting !== null,
      run: () => undefined,
    });
    void this.build(`${old.name}r`, old.spec.role).then((fresh) => {
      this.w.extra.push(fresh);
      this.attach(m, fresh);
      // What a feed reconnecting to the new life hears first: its epoch.
      this.index.heartbeat(m.url, fresh.engine.kvEvents.epoch, fresh.engine.kvEvents.seq);
      this.restarting = null;
    });
  }

  /** At the end: the last heartbeats (and dumps) bring every live instance's index to its pool. */
  judgeEnd(): void {
    for (const [url, inst] of this.behind) {
      if (!inst.alive) continue;
      this.heartbeat(url);
      if (!this.caughtUp(url))
        this.w.violate('router-index', `${inst.name}: index not caught up after the last heartbeat`);
      else this.judgeSets(url, inst, 'after the last heartbeat');
    }
  }
}

/** What /handoff/info would say of a sim instance (what the router needs: block size, cached groups). */
function infoOf(inst: SimInstance): InstanceInfo {
  const producer = inst.spec.role === 'producer';
  return {
    engine_id: inst.engineId,
    role: producer ? 'prefill' : 'decode',
    model: inst.spec.preset,
    preset: inst.spec.preset,
    kv_role: producer ? 'kv_producer' : 'kv_consumer',
    transfer_mode: inst.spec.connector.mode,
    side_channel_host: null,
    side_channel_port: null,
    data_port: null,
    max_model_len: inst.engine.scheduler.config.maxModelLen,
    num_pages: inst.kvConfig.numBlocks - 1,
    block_size: inst.spec.blockSize,
    prefix_cache_groups: inst.engine.kv.prefixCacheGroups(),
    kv_events_epoch: inst.engine.kvEvents.epoch,
  };
}
