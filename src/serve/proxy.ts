/**
 * Proxy: the P/D router in front of prefill and decode instances (OpenAI API in, OpenAI API out).
 *
 *   client ──> proxy ──(READ: 1st)──> prefill  (max_tokens 1, do_remote_decode) ──> kv_transfer_params
 *                    └─(READ: 2nd)──> decode   (original body + those params) ──> streamed back as is
 *              WRITE: both at once with one transfer_id; decode learns prefill's side channel from
 *              prefill's /handoff/info (fetched by the health checks).
 *              The flow itself (order, params, which error is the answer) is pdFlow (pd_flow.ts), the
 *              same function the simulator runs; this file supplies the two HTTP legs.
 *
 * Routing (kv_router.ts): round robin, least loaded, or kv-aware (decode first by prefix overlap from
 * the RouterIndex that KvEventFeeds keep current from every instance's KV events, minus load; no remote
 * prefill when decode already holds all but a short rest of the prompt). A request whose instance died (refused,
 * reset, silent until taken out) or drained (503) before anything was streamed is retried on untried instances.
 *
 * Instances are checked periodically (GET /health, bounded) and on every failed connection; unhealthy
 * ones are skipped. A healthy instance whose check times out once (a busy machine) stays in; twice in a
 * row, or refused, or answering 503, it is out. Errors of either side reach the client as one OpenAI
 * error JSON with the upstream's status; X-Request-Id is generated if absent and forwarded to both; a
 * client that disconnects aborts both upstream requests (the instances then abort theirs and free the
 * pages). Long prompts are tokenized (to refuse what decode would refuse) on a tokenizer thread, off the
 * event loop.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { rethrowIfAssertion } from '../util/assert.ts';
import type { Env, TimerHandle } from '../util/env.ts';
import { HandoffError, listenFailed } from '../util/errors.ts';
import { hexId, upstreamRequestId } from '../util/ids.ts';
import type { Logger } from '../util/log.ts';
import { checkBearer, pathOf, readJsonBody, requestIdOf, sendJson, toHandoffError } from './http_io.ts';
import { InstancePool, isUnreachable, type PoolMember, type RoutingPolicy } from './instance_pool.ts';
import type { InstanceInfo } from './instance_server.ts';
import { ProxyMetrics } from './proxy_metrics.ts';
import { parseInstanceInfo } from './instance_info.ts';
import { unpairedReason } from './pool_pairing.ts';
import { membersOf, pickMember, retryRouteOr, routeOf } from './proxy_routes.ts';
import { DEFAULT_TOKENIZER_THREADS, TokenizerThreads } from './tokenizer_threads.ts';
import { pdFlow } from './pd_flow.ts';
import { KvEventFeed } from './kv_event_feed.ts';
import { DEFAULT_KV_ROUTER_OPTIONS, KvRouter, type KvRouterOptions } from './kv_router.ts';
import type { RouteDecision } from './kv_router.ts';
import { RouterIndex } from './router_index.ts';
import { checkLimits, decodeBody, forwardHeaders, prefillBody, prefillIdentityOf } from './proxy_flow.ts';
import type { Call, Failed } from './proxy_flow.ts'; // one client request, one failed attempt
import { CompletionGate } from './proxy_drain.ts';
import { CLIENT_STALL_MS, cutMidStream, relay } from './proxy_relay.ts';
import { droppedUnsent, dropIfUnsent, onResponseGone } from './response_sinks.ts';
import {
  callUnlessGone,
  callUpstream,
  inBandCancel,
  notifyUpstream,
  PASSED_TO_DECODE,
  passThrough,
  readAnswer,
  upstreamError,
  withStatus,
} from './upstream.ts';

export interface ProxyOptions {
  prefillUrls: string[];
  decodeUrls: string[];
  mode: 'read' | 'write';
  policy: RoutingPolicy;
  /** kv-aware scoring (kv_router.ts). */
  router: KvRouterOptions;
  apiKey: string | null;
  healthIntervalMs: number;
  healthTimeoutMs: number;
  /** Bound on one upstream request, queueing and streaming included. */
  upstreamTimeoutMs: number;
  /** A client that takes no byte of its answer for this long is dropped (default CLIENT_STALL_MS). */
  clientStallMs?: number;
}

export const DEFAULT_PROXY_OPTIONS: Omit<ProxyOptions, 'prefillUrls' | 'decodeUrls'> = {
  mode: 'read',
  policy: 'round-robin',
  router: DEFAULT_KV_ROUTER_OPTIONS,
  apiKey: null,
  healthIntervalMs: 2000,
  healthTimeoutMs: 1000,
  upstreamTimeoutMs: 600_000,
};

type Body = Record<string, unknown>;

/** Health checks in a row that may time out before a healthy instance is marked down. */
const SLOW_CHECKS_MAX = 2;
/** Health checks in a row that timed out before the calls still waiting on that instance fail over (frozen). */
const FROZEN_CHECKS = 5;

export class Proxy {
  readonly prefill: InstancePool;
  readonly decode: InstancePool;
  readonly metrics: ProxyMetrics;
  /** What each instance's prefix cache holds, from its KV events (kv-aware only). */
  readonly index = new RouterIndex();
  readonly router: KvRouter;
  private readonly feeds: KvEventFeed[] = [];
  /** Health checks in a row that timed out, per member still considered healthy. */
  private readonly slowChecks = new Map<PoolMember, number>();
  private rechecking: Promise<void> | null = null;
  private readonly server: Server;
  private readonly tokenizer = new TokenizerThreads(DEFAULT_TOKENIZER_THREADS);
  private timer: TimerHandle | null = null;
  private closed = false;
  private readonly gate: CompletionGate;

  constructor(
    readonly opts: ProxyOptions,
    private readonly env: Env,
    private readonly log?: Logger,
  ) {
    this.prefill = new InstancePool('prefill', opts.prefillUrls, opts.policy);
    this.decode = new InstancePool('decode', opts.decodeUrls, opts.policy);
    this.metrics = new ProxyMetrics([this.prefill, this.decode]);
    this.gate = new CompletionGate(env);
    this.router = new KvRouter(this.index, opts.router);
    this.server = createServer((req, res) => void this.route(req, res));
    this.server.keepAliveTimeout = 30_000;
  }

  /** One round of health checks now, then one every healthIntervalMs; kv-aware: every instance's KV events. */
  async start(): Promise<void> {
    await this.checkHealth();
    if (this.opts.policy === 'kv-aware' && this.feeds.length === 0) {
      for (const m of [...this.prefill.members, ...this.decode.members]) {
        const feedOpts = { url: m.url, apiKey: this.opts.apiKey, retryMs: 500, stallMs: 5000 };
        const feed = new KvEventFeed(m.url, this.index, { ...feedOpts, onLoad: (l) => (m.load = l) }, this.env);
        feed.start();
        this.feeds.push(feed);
      }
    }
    const tick = (): void => {
      this.timer = this.env.setTimer(this.opts.healthIntervalMs, () => {
        void this.checkHealth().finally(() => {
          if (!this.closed) tick();
        });
      });
    };
    tick();
  }

  listen(port: number, host: string): Promise<number> {
    return new Promise((resolve, reject) => {
      this.server.once('error', (e) => reject(listenFailed(e, host, port)));
      this.server.listen(port, host, () => resolve((this.server.address() as AddressInfo).port));
    });
  }

  get healthy(): boolean {
    return !this.gate.isDraining && this.prefill.numHealthy > 0 && this.decode.numHealthy > 0;
  }

  /** SIGTERM: refuse new completions and wait for those under way (bounded); close() still has to be called. */
  drain(timeoutMs: number): Promise<boolean> {
    return this.gate.drain(timeoutMs);
  }

  async close(): Promise<void> {
    this.closed = true;
    this.timer?.cancel();
    this.metrics.close();
    const done = new Promise<void>((resolve) => this.server.close(() => resolve()));
    this.server.closeAllConnections();
    await Promise.all([done, this.tokenizer.close(), ...this.feeds.map((f) => f.close())]);
  }

  /**
   * One health round now, shared by every caller while it runs (no herd of checks from requests), the
   * periodic tick included: two rounds at once counted one slow answer twice (two in a row: out).
   */
  checkHealth(): Promise<void> {
    this.rechecking ??= this.healthRound().finally(() => (this.rechecking = null));
    return this.rechecking;
  }

  private async healthRound(): Promise<void> {
    const all = [
      ...this.prefill.members.map((m) => ({ pool: this.prefill, m })),
      ...this.decode.members.map((m) => ({ pool: this.decode, m })),
    ];
    const passed = new Map<PoolMember, InstanceInfo | null>();
    await Promise.all(all.map(({ pool, m }) => this.checkOne(pool, m, passed)));
    // Pairing is judged over what passed this round and what is still in (one slow check): no order.
    const candidates = all
      .filter(({ m }) => passed.has(m) || m.healthy)
      .map(({ pool, m }) => ({ side: pool.side, info: passed.has(m) ? (passed.get(m) ?? null) : m.info }));
    for (const { pool, m } of all.filter(({ m }) => passed.has(m))) {
      const info = passed.get(m) ?? null;
      const why = unpairedReason({ side: pool.side, info }, candidates);
      if (why) this.down(pool, m, why);
      else pool.markUp(m, info ?? undefined);
      if (!why) this.slowChecks.delete(m);
    }
  }

  /** Checks one instance on its own: down now, or in `passed` with its info (null: it has none). */
  private async checkOne(
    pool: InstancePool,
    m: PoolMember,
    passed: Map<PoolMember, InstanceInfo | null>,
  ): Promise<void> {
    // Bodies are read as text: vLLM's /health answers 200 with an empty one.
    const get = async (path: string): Promise<{ ok: boolean; status: number; body: string }> => {
      const u = await callUpstream(this.env, {
        method: 'GET',
        url: `${m.url}${path}`,
        timeoutMs: this.opts.healthTimeoutMs,
      });
      try {
        return { ok: u.response.ok, status: u.response.status, body: u.response.ok ? await u.response.text() : '' };
      } finally {
        u.done();
      }
    };
    try {
      const h = await get('/health');
      if (!h.ok) return this.down(pool, m, `/health answered ${h.status}`);
      const i = await get('/handoff/info');
      // A server without /handoff/info (e.g. vLLM) can still serve READ mode; ours must match the proxy.
      const info = i.ok ? parseInstanceInfo(i.body) : null;
      const why = info ? this.incompatibility(pool, info) : null;
      if (why) return this.down(pool, m, why);
      passed.set(m, info);
    } catch (e) {
      rethrowIfAssertion(e);
      // Timed out: out after SLOW_CHECKS_MAX in a row, gone (callers fail over) after FROZEN_CHECKS; refused: gone.
      const slow = (this.slowChecks.get(m) ?? 0) + 1;
      const timedOut = e instanceof HandoffError && e.code === 'TIMEOUT';
      if (timedOut) this.slowChecks.set(m, slow);
      if (timedOut && m.healthy && slow < SLOW_CHECKS_MAX) return;
      const gone = isUnreachable(e) && (!timedOut || slow >= FROZEN_CHECKS);
      this.down(pool, m, e instanceof Error ? e.message : String(e), gone);
    }
  }

  private incompatibility(pool: InstancePool, info: InstanceInfo): string | null {
    const want = pool.side === 'prefill' ? ['kv_producer', 'kv_both'] : ['kv_consumer', 'kv_both'];
    if (!want.includes(String(info.kv_role)))
      return `it is not a ${pool.side} instance (kv_role ${String(info.kv_role)})`;
    if (info.transfer_mode !== this.opts.mode)
      return `it runs in ${String(info.transfer_mode)} mode, the proxy in ${this.opts.mode} mode`;
    return null;
  }

  private down(pool: InstancePool, m: PoolMember, why: string, unreachable = false): void {
    if (m.healthy || m.lastError !== why) this.log?.warn({ side: pool.side, url: m.url, why }, 'instance unhealthy');
    pool.markDown(m, why, unreachable);
  }

  private async route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = pathOf(req);
    const isCompletion = req.method === 'POST' && (path === '/v1/completions' || path === '/v1/chat/completions');
    try {
      if (req.method === 'GET' && path === '/health') {
        return sendJson(res, this.healthy ? 200 : 503, {
          status: this.healthy ? 'ok' : 'unavailable',
          prefill: this.prefill.numHealthy,
          decode: this.decode.numHealthy,
        });
      }
      if (req.method === 'GET' && path === '/metrics') {
        const m = await this.metrics.text();
        res.writeHead(200, { 'content-type': m.contentType });
        res.end(m.body);
        return;
      }
      const passed = PASSED_TO_DECODE.get(path) === req.method;
      if (path.startsWith('/v1/') || (passed && path !== '/version')) checkBearer(req, this.opts.apiKey);
      if (passed)
        return await passThrough(this.env, pickMember(this.decode).url, req, res, this.opts.healthTimeoutMs * 5);
      if (isCompletion) return await this.complete(path, req, res);
      throw new HandoffError('NOT_FOUND', `no route for ${req.method ?? '?'} ${path}`);
    } catch (e) {
      const err = toHandoffError(e, this.log);
      // handoff_proxy_requests_total counts completions only (not a scanner's 404s or /v1/models).
      if (isCompletion) this.metrics.count(err.code === 'REQUEST_ABORTED' ? 'client_abort' : 'error');
      const status =
        typeof err.details?.['upstreamStatus'] === 'number'
          ? (err.details['upstreamStatus'] as number)
          : err.httpStatus;
      sendJson(res, status, err.toJSON());
    } finally {
      // An answer written whole (up to UPSTREAM_BODY_MAX_BYTES) to a client that never reads stayed queued here.
      if (res.writableEnded) dropIfUnsent(res, this.opts.clientStallMs ?? CLIENT_STALL_MS, this.env);
    }
  }

  /** A completion, counted by the drain once its body is in (one still trickling in is refused then, not awaited). */
  private async complete(path: string, req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (this.gate.isDraining) throw new HandoffError('OVERLOADED', 'the proxy is draining');
    const requestId = requestIdOf(req, this.env);
    res.setHeader('x-request-id', requestId);
    const body = await readJsonBody(req);
    await this.gate.run(() => this.completeBody(path, req, res, { requestId, body }));
  }

  private async completeBody(
    path: string,
    req: IncomingMessage,
    res: ServerResponse,
    { requestId, body }: { requestId: string; body: Body },
  ): Promise<void> {
    const client = new AbortController();
    // Not res 'close' alone: a response pipelined behind another never gets it when the connection closes.
    onResponseGone(res, () => {
      if (!res.writableFinished) client.abort();
    });
    const checked = await this.promptTokens(path, body);
    const tokenIds = checked?.tokenIds ?? null;
    // A side with no healthy instance may only have missed one check (a slow start): ask again first.
    if (this.prefill.numHealthy === 0 || this.decode.numHealthy === 0) await this.checkHealth();
    const exclude = new Set<PoolMember>(checked?.unfit);
    let first: unknown = null;
    const routing = { policy: this.opts.policy, kv: this.router };
    // Counted once, by the route of its last attempt: a retried request is not two requests.
    let tried: RouteDecision | null = null;
    try {
      for (let attempt = 1; ; attempt++) {
        const upstreamId = upstreamRequestId(requestId, this.env, attempt);
        const call: Call = { path, body, headers: forwardHeaders(req, upstreamId), res, client: client.signal };
        // No other instance to retry on (1P1D): the client gets the first attempt's own error (a 503).
        const route =
          first === null
            ? routeOf(this, routing, tokenIds, exclude)
            : retryRouteOr(this, routing, tokenIds, exclude, first);
        if (first !== null) this.metrics.retried(); // counted once another instance takes it
        const failed: Failed = { m: null, held: null };
        tried = route;
        try {
          await this.serveRoute(route, call, failed);
          this.countAnswered(res);
          return;
        } catch (e) {
          rethrowIfAssertion(e);
          this.releaseHeld(failed, exclude, call.headers); // retried or not; leaves it out of the next route
          if (failed.m === null || res.headersSent || client.signal.aborted) throw e;
          first ??= e;
          this.log?.warn({ url: failed.m.url, err: (e as Error).message }, 'retrying the request on another instance');
        }
      }
    } finally {
      if (tried !== null) this.metrics.routed(tried.prefill === null ? 'decode-only' : 'pd');
    }
  }

  /**
   * A served completion's outcome, once its answer left: one still queued for a client that reads none of
   * it (dropped by dropIfUnsent) never reached that client, and is not an ok completion.
   */
  private countAnswered(res: ServerResponse): void {
    const outcome = cutMidStream.has(res) ? 'error' : 'ok';
    if (res.writableFinished) return this.metrics.count(outcome);
    // Not res.writableFinished then, nor 'finish': both also hold for a socket destroyed with bytes queued.
    onResponseGone(res, () => this.metrics.count(droppedUnsent.has(res) ? 'client_abort' : outcome));
  }

  /** A decode that failed after prefill answered will never read: have another decode release the pages. */
  private releaseHeld(failed: Failed, exclude: Set<PoolMember>, headers: Record<string, string>): void {
    // A kv_both instance listed in both pools: the retry must not reach it through its other member either.
    if (failed.m !== null) for (const s of membersOf(this, failed.m)) exclude.add(s.m);
    const other = failed.held === null || failed.m === null ? null : this.decode.pick(exclude);
    if (other !== null && failed.held !== null) void this.releaseUnused(other, failed.held, headers);
  }

  /** The prompt's token ids (kv-aware routing) and the instances that would refuse it (proxy_flow.ts). */
  private promptTokens(path: string, body: Body): Promise<{ tokenIds: number[]; unfit: PoolMember[] } | null> {
    const kind = path === '/v1/completions' ? 'completion' : 'chat';
    const pools = { prefill: this.prefill.members, decode: this.decode.members };
    return checkLimits(kind, body, pools, (text) => this.tokenizer.encode(text));
  }

  private async serveRoute(route: RouteDecision, call: Call, failed: Failed): Promise<void> {
    const { path, body, headers, res, client } = call;
    const d = route.decode;
    const relayTo = (signal: AbortSignal) => (r: Response, upstream: AbortSignal) =>
      relay(r, res, AbortSignal.any([signal, upstream]), this.env, this.opts.clientStallMs);
    if (route.prefill === null) {
      const plain = { ...body };
      delete plain['kv_transfer_params'];
      return this.post('decode', d, { path, body: plain, headers, signal: client }, relayTo(client), failed);
    }
    const p = route.prefill;
    const transferId = `xfer-${hexId(this.env, 16)}`;
    const unreserve = this.decode.reserve(d); // loaded from now, while prefill runs: a burst sees it busy
    await pdFlow<void>(
      {
        prefill: async (ask, signal) => {
          // Once prefill answers, its answer is read even if the client left: pdFlow then has its pages released.
          // READ: the client leaving is told to prefill in band (upstream.ts inBandCancel), so an answer
          // already on its way is not lost with the pages it holds (until the lease).
          const timeoutMs = this.opts.healthTimeoutMs;
          const leg =
            this.opts.mode === 'read'
              ? inBandCancel(this.env, this.log, { base: p.url, headers, timeoutMs }, signal)
              : null;
          const c = {
            path,
            body: prefillBody(body, ask),
            headers,
            signal: leg?.signal ?? signal,
            signalUntilHeaders: true,
          };
          try {
            const read = async (r: Response): Promise<Body> => {
              leg?.dispose(); // the answer is here: nothing left to cancel
              return await readAnswer(r, 'prefill');
            };
            const answer = await this.post('prefill', p, c, read, failed);
            return { kvTransferParams: answer['kv_transfer_params'] };
          } finally {
            leg?.dispose();
          }
        },
        decode: (params, signal) => {
          unreserve(); // the call counts it from here
          if (this.opts.mode === 'read') failed.held = params;
          return this.post(
            'decode',
            d,
            { path, body: decodeBody(body, params), headers, signal },
            relayTo(signal),
            failed,
          );
        },
        releaseUnused: (params) => void this.releaseUnused(d, params, headers),
      },
      { mode: this.opts.mode, transferId, prefill: prefillIdentityOf(p.info), signal: client },
    ).finally(unreserve);
  }

  /** Ask decode to release prefill's pages for a request it will never get; best effort (the lease is the fallback). */
  private releaseUnused(d: PoolMember, params: Body, headers: Record<string, string>): Promise<void> {
    const body = { kv_transfer_params: params };
    const what = 'release of unused prefill pages failed; the lease frees them';
    return notifyUpstream(this.env, this.log, { url: `${d.url}/handoff/release`, body, headers, what }, this.opts);
  }

  /**
   * Run `fn` with `m` counted as loaded. A connection failure marks it down at once; it and a 503 (a
   * draining or overloaded instance) name `m` in `failed`: the request may be retried elsewhere.
   */
  private async using<T>(pool: InstancePool, m: PoolMember, fn: () => Promise<T>, failed?: Failed): Promise<T> {
    pool.acquire(m);
    try {
      return await fn();
    } catch (e) {
      const dead = e instanceof HandoffError && e.code === 'PEER_UNAVAILABLE' && e.details === undefined;
      if (dead) for (const s of membersOf(this, m)) this.down(s.pool, s.m, e.message, true);
      if (failed && (dead || (e instanceof HandoffError && e.details?.['upstreamStatus'] === 503))) failed.m = m;
      throw e;
    } finally {
      pool.release(m);
    }
  }

  /** POST to one upstream of `role`, counted as load on it; a non-2xx answer becomes its error. */
  private post<T>(
    role: 'prefill' | 'decode',
    m: PoolMember,
    call: {
      path: string;
      body: Body;
      headers: Record<string, string>;
      signal: AbortSignal;
      signalUntilHeaders?: boolean;
    },
    onOk: (response: Response, upstream: AbortSignal) => Promise<T>,
    failed?: Failed,
  ): Promise<T> {
    const pool = role === 'prefill' ? this.prefill : this.decode;
    return this.using(
      pool,
      m,
      async () => {
        const u = await callUnlessGone(this.env, {
          method: 'POST',
          url: `${m.url}${call.path}`,
          body: call.body,
          headers: call.headers,
          signal: call.signal,
          signalUntilHeaders: call.signalUntilHeaders ?? false,
          timeoutMs: this.opts.upstreamTimeoutMs,
          gone: pool.goneSignal(m), // taken out as unreachable while waiting: fail over (retried elsewhere)
        });
        try {
          if (!u.response.ok) throw withStatus(await upstreamError(role, u.response), u.response.status);
          return await onOk(u.response, u.signal);
        } finally {
          u.done();
        }
      },
      failed,
    );
  }
}
