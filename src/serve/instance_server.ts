/**
 * InstanceServer: the OpenAI-compatible HTTP front of one engine (prefill, decode or colocated).
 *
 *   POST /v1/completions, /v1/chat/completions   JSON or SSE; kv_transfer_params in and out (vLLM style)
 *   GET  /v1/models                               the served model
 *   POST /tokenize, /detokenize; GET /version     vLLM's tokenizer endpoints and version (tokenize_api.ts)
 *   GET  /health                                  200 while the engine loop is alive, else 503
 *   GET  /metrics                                 Prometheus text (this instance's registry)
 *   GET  /handoff/info                            engine id, role, side channel (the proxy's WRITE mode)
 *   POST /handoff/release                         decode: {kv_transfer_params} of a request it will never
 *                                                 get (client gone after prefill answered): release them
 *   POST /handoff/cancel                          {request_id}: abort that request if it still runs; its
 *                                                 client (the proxy) stays connected and gets the abort,
 *                                                 or the answer if it had finished (nothing is lost)
 *   GET  /handoff/kv_events[?since=SEQ]           the KV events as an NDJSON stream (kv_event_stream.ts)
 *   GET  /handoff/kv_events/dump                  every cached block hash at the current seq
 *   POST /handoff/reset_prefix_cache              forget every cached prefix (refused while pages are in use)
 *
 * Draining (SIGTERM): `drain()` turns /health and new completions into 503s at once, then waits
 * (bounded) until nothing runs, waits, or is held for a peer's READ, and only then closes: an instance
 * being stopped finishes its in-flight requests and transfers first.
 *
 * A decode instance in READ mode also speaks llm-d's sidecar protocol (sidecar.ts): a completion with an
 * `x-prefiller-host-port` header is prefilled there first, then decoded here.
 *
 * /v1/* needs `Authorization: Bearer <key>` when an API key is set. X-Request-Id becomes the engine's
 * request id (a duplicate of a live request is a 400) and is echoed. A client that disconnects before
 * the response is complete aborts its request, so its pages go back to the pool. Long prompts are
 * tokenized on a tokenizer thread (TokenizerThreads), so /health and other requests keep answering.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Env } from '../util/env.ts';
import { HandoffError, listenFailed } from '../util/errors.ts';
import { upstreamRequestId } from '../util/ids.ts';
import type { Logger } from '../util/log.ts';
import { Generation, type EngineHandle } from './generation.ts';
import { checkBearer, pathOf, readJsonBody, requestIdOf, sendError, sendJson, toHandoffError } from './http_io.ts';
import { InstanceMetrics, type InstanceStatsSnapshot } from './metrics.ts';
import {
  attributeParam,
  tokenizedApiRequest,
  validateApiRequest,
  type ApiKind,
  type ApiRequest,
  type ValidatedRequest,
} from './openai_request.ts';
import type { ResponseContext } from './openai_response.ts';
import { ANSWER_STALL_MS, jsonSink, onResponseGone, streamSink, withStallBound } from './response_sinks.ts';
import { KvEventStreams, type InstanceLoad, type KvEventSource } from './kv_event_stream.ts';
import { PREFILLER_HEADER, prefillerOf, runSidecar, type Prefiller } from './sidecar.ts';
import { detokenizeAnswer, HANDOFF_VERSION, tokenizeAnswer } from './tokenize_api.ts';
import type { PeerAllowList } from '../connector/peer_directory.ts';
import { parseKvTransferParams } from '../connector/params.ts';
import { DEFAULT_TOKENIZER_THREADS, TokenizerThreads, type TokenizerThreadsOptions } from './tokenizer_threads.ts';
import type { GenerationObserver, GenerationSink } from './generation.ts';

export type ServeRole = 'prefill' | 'decode' | 'both';

/** GET /handoff/info (snake_case: it is wire data). */
export interface InstanceInfo {
  engine_id: string | null;
  role: ServeRole;
  model: string;
  preset: string;
  kv_role: 'kv_producer' | 'kv_consumer' | 'kv_both' | null;
  transfer_mode: 'read' | 'write' | null;
  side_channel_host: string | null;
  side_channel_port: number | null;
  data_port: number | null;
  max_model_len: number;
  num_pages: number;
  /** Tokens per KV page: a router hashes prompts by it (kv/block_hash.ts). */
  block_size: number;
  /** KV cache groups whose pages are prefix-cached and named by KV events (empty: no prefix caching). */
  prefix_cache_groups: number[];
  /** This life of the instance in its KV events (a restart changes it). */
  kv_events_epoch: string;
  /**
   * The transfer handshake's compatibility hash (model, preset, weight seed, cache layout): a prefill and a
   * decode whose hashes differ cannot pair. Null without a connector; absent from older or foreign servers.
   */
  compat_hash?: string | null;
}

export interface InstanceServerOptions {
  modelName: string;
  apiKey: string | null;
  maxModelLen: number;
  info: InstanceInfo;
  tokenizerThreads?: TokenizerThreadsOptions;
  /** Period of the KV event stream's heartbeats. */
  kvHeartbeatMs?: number;
  /** Prefillers an `x-prefiller-host-port` header may name (the --kv-peers allow-list). */
  prefillerPeers: PeerAllowList;
  /** Bound on the sidecar's prefill leg. */
  sidecarTimeoutMs?: number;
  /** A finished answer its client takes no byte of for this long is dropped (default ANSWER_STALL_MS). */
  clientStallMs?: number;
}

/** An early cancel waits this long for its request to start, and at most this many wait. */
const EARLY_CANCEL_MS = 30_000;
const EARLY_CANCELS_MAX = 1024;

/** Set `id` in a map of at most EARLY_CANCELS_MAX ids (the oldest goes first). */
function remember(m: Map<string, number>, id: string, at: number): void {
  m.delete(id);
  const oldest = m.keys().next();
  if (m.size >= EARLY_CANCELS_MAX && oldest.done !== true) m.delete(oldest.value);
  m.set(id, at);
}

/** What the server needs of an engine besides submit/abort. */
export interface ServedEngine extends EngineHandle {
  /** Non-null once the engine loop died. */
  readonly crashed: Error | null;
  /** Decode: send prefill the release of a READ this instance will never load; true if queued. */
  releaseUnused(kvTransferParams: unknown): boolean;
  readonly kvEvents: KvEventSource;
  load(): InstanceLoad;
  /** Forget every cached prefix; false (nothing changed) while any page is in use. */
  resetPrefixCache(): boolean;
}

export class InstanceServer {
  readonly metrics: InstanceMetrics;
  private readonly server: Server;
  private readonly live = new Map<Generation, ServerResponse>();
  /** Cancels that came before their request started here (still reading or tokenizing it): id → when. */
  private readonly earlyCancels = new Map<string, number>();
  /** Requests answered here lately: id → when (a cancel for one of them is late, not early). */
  private readonly recentlyDone = new Map<string, number>();
  private readonly tokenizer: TokenizerThreads;
  private readonly kvStreams: KvEventStreams;
  private closing = false;
  private draining = false;
  /** Completions read and not yet in `live` (tokenizing, an llm-d prefiller): drain waits for them. */
  private starting = 0;

  constructor(
    private readonly engine: ServedEngine,
    private readonly opts: InstanceServerOptions,
    private readonly env: Env,
    readStats: () => InstanceStatsSnapshot,
    private readonly log?: Logger,
  ) {
    this.metrics = new InstanceMetrics({ role: opts.info.role, model: opts.modelName }, readStats);
    this.tokenizer = new TokenizerThreads(opts.tokenizerThreads ?? DEFAULT_TOKENIZER_THREADS);
    this.kvStreams = new KvEventStreams(engine.kvEvents, () => engine.load(), env, opts.kvHeartbeatMs);
    this.server = createServer((req, res) => void this.route(req, res));
    this.server.keepAliveTimeout = 30_000;
  }

  /** Listen; resolves with the bound port (pass 0 for a free one). */
  listen(port: number, host: string): Promise<number> {
    return new Promise((resolve, reject) => {
      this.server.once('error', (e) => reject(listenFailed(e, host, port)));
      this.server.listen(port, host, () => resolve((this.server.address() as AddressInfo).port));
    });
  }

  get numLive(): number {
    return this.live.size;
  }

  /**
   * Stop taking new requests (503 on /health and on new completions), then wait until every live request
   * is answered and no page is held for a peer (bounded by `timeoutMs`). Resolves true when it drained,
   * false when time ran out. close() still has to be called.
   */
  async drain(timeoutMs: number): Promise<boolean> {
    this.draining = true;
    const deadline = this.env.nowMs() + timeoutMs;
    const busy = (): boolean => {
      const l = this.engine.load();
      return this.starting > 0 || this.live.size > 0 || l.running + l.waiting + l.held_for_send > 0;
    };
    while (busy()) {
      if (this.env.nowMs() >= deadline) return false;
      await this.env.sleep(20);
    }
    return true;
  }

  get isDraining(): boolean {
    return this.draining;
  }

  /** Stop accepting, end every live request (aborted in the engine), close all connections. */
  async close(): Promise<void> {
    this.closing = true;
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const [gen, res] of this.live) {
      gen.cancel();
      res.destroy();
    }
    this.live.clear();
    this.kvStreams.closeAll();
    this.metrics.close();
    this.server.closeAllConnections();
    await Promise.all([closed, this.tokenizer.close()]);
  }

  private async route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = pathOf(req);
    try {
      if (req.method === 'GET' && path === '/health') return this.health(res);
      if (req.method === 'GET' && path === '/metrics') {
        const m = await this.metrics.text();
        res.writeHead(200, { 'content-type': m.contentType });
        res.end(m.body);
        return;
      }
      if (req.method === 'GET' && path === '/handoff/info') return sendJson(res, 200, this.opts.info);
      if (req.method === 'GET' && path === '/version') return sendJson(res, 200, { version: HANDOFF_VERSION });
      const tokenizing = path === '/tokenize' || path === '/detokenize';
      if (path.startsWith('/v1/') || tokenizing || (path.startsWith('/handoff/') && path !== '/handoff/info'))
        checkBearer(req, this.opts.apiKey);
      if (req.method === 'POST' && tokenizing) return await this.tokenizeApi(path, req, res);
      if (req.method === 'POST' && path === '/handoff/release') return await this.releaseUnused(req, res);
      if (req.method === 'POST' && path === '/handoff/cancel') return await this.cancel(req, res);
      if (req.method === 'GET' && path === '/handoff/kv_events') return this.kvStreams.stream(req, res);
      if (req.method === 'GET' && path === '/handoff/kv_events/dump')
        return await this.kvStreams.dump(res, this.opts.clientStallMs ?? ANSWER_STALL_MS);
      if (req.method === 'POST' && path === '/handoff/reset_prefix_cache')
        return sendJson(res, 200, { reset: this.engine.resetPrefixCache() });
      if (req.method === 'GET' && path === '/v1/models') return sendJson(res, 200, this.models());
      if (req.method === 'POST' && path === '/v1/completions') return await this.generate('completion', req, res);
      if (req.method === 'POST' && path === '/v1/chat/completions') return await this.generate('chat', req, res);
      throw new HandoffError('NOT_FOUND', `no route for ${req.method ?? '?'} ${path}`);
    } catch (e) {
      const kind: ApiKind = path === '/v1/chat/completions' ? 'chat' : 'completion';
      const err = attributeParam(toHandoffError(e, this.log), kind);
      this.metrics.countError(err.code);
      sendError(res, err, this.log);
    }
  }

  private async tokenizeApi(path: string, req: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = await readJsonBody(req);
    const deps = {
      modelName: this.opts.modelName,
      limits: { maxModelLen: this.opts.maxModelLen },
      encode: (text: string) => this.tokenizer.encode(text),
    };
    sendJson(res, 200, path === '/tokenize' ? await tokenizeAnswer(body, deps) : detokenizeAnswer(body, deps));
  }

  private health(res: ServerResponse): void {
    const crashed = this.engine.crashed;
    if (crashed || this.closing || this.draining) {
      const why = crashed ? `engine loop crashed: ${crashed.message}` : this.closing ? 'shutting down' : 'draining';
      sendJson(res, 503, new HandoffError(crashed ? 'INTERNAL' : 'OVERLOADED', why).toJSON());
      return;
    }
    sendJson(res, 200, { status: 'ok', role: this.opts.info.role });
  }

  private models(): unknown {
    const created = Math.floor(this.env.wallMs() / 1000);
    return {
      object: 'list',
      data: [
        {
          id: this.opts.modelName,
          object: 'model',
          created,
          owned_by: 'handoff',
          max_model_len: this.opts.maxModelLen,
        },
      ],
    };
  }

  /** POST /handoff/cancel: the proxy's client went away while this request ran here (see the header). */
  private async cancel(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const id: unknown = (await readJsonBody(req))['request_id'];
    if (typeof id !== 'string' || id.length === 0 || id.length > 256)
      throw new HandoffError('BAD_REQUEST', 'request_id must be a string of 1 to 256 characters', {
        param: 'request_id',
      });
    const gen = [...this.live.keys()].find((g) => g.requestId === id);
    const now = this.env.nowMs();
    // A cancel for a request that was answered here lately came after its answer: it must not wait for,
    // and cancel, the next request that reuses the id.
    const late = now - (this.recentlyDone.get(id) ?? -Infinity) < EARLY_CANCEL_MS;
    if (gen === undefined && !late) remember(this.earlyCancels, id, now);
    sendJson(res, 200, { cancelled: gen?.cancelInBand() ?? false });
  }

  /** POST /handoff/release: the proxy's client went away between prefill's answer and this decode request. */
  private async releaseUnused(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = await readJsonBody(req);
    const params: unknown = body['kv_transfer_params'];
    if (params === undefined || params === null)
      throw new HandoffError('BAD_REQUEST', 'kv_transfer_params is required', { param: 'kv_transfer_params' });
    const p = params as { do_remote_prefill?: boolean } | null;
    this.checkTransferRole(typeof p === 'object' && p !== null ? { do_remote_prefill: p.do_remote_prefill } : null);
    sendJson(res, 200, { released: this.engine.releaseUnused(params) });
  }

  /** A P/D half sent to an instance that cannot play it would silently compute everything locally. */
  private checkTransferRole(
    p: { do_remote_decode?: boolean | undefined; do_remote_prefill?: boolean | undefined } | null,
  ): void {
    const kvRole = this.opts.info.kv_role;
    if (p?.do_remote_decode === true && kvRole !== 'kv_producer' && kvRole !== 'kv_both') {
      throw new HandoffError(
        'BAD_TRANSFER_PARAMS',
        `do_remote_decode needs a prefill instance; this one is ${this.opts.info.role} (kv_role ${String(kvRole)})`,
        {
          param: 'kv_transfer_params.do_remote_decode',
        },
      );
    }
    if (p?.do_remote_prefill === true && kvRole !== 'kv_consumer' && kvRole !== 'kv_both') {
      throw new HandoffError(
        'BAD_TRANSFER_PARAMS',
        `do_remote_prefill needs a decode instance; this one is ${this.opts.info.role} (kv_role ${String(kvRole)})`,
        {
          param: 'kv_transfer_params.do_remote_prefill',
        },
      );
    }
  }

  /** Count a completion (its body in) as starting until it is under way (in `live`) or refused. */
  private async starts(p: Promise<void>): Promise<void> {
    this.starting++;
    try {
      await p;
    } finally {
      this.starting--;
    }
  }

  private async generate(kind: ApiKind, req: IncomingMessage, res: ServerResponse): Promise<void> {
    const arrivedMs = this.env.nowMs();
    const requestId = requestIdOf(req, this.env);
    res.setHeader('x-request-id', requestId);
    const prefiller = prefillerOf(req, this.opts.prefillerPeers);
    const body = await readJsonBody(req);
    // Starting from here, not from its first byte: a body still coming when a drain began is refused once
    // in (prepare, and below), so a client trickling its body held every drain for nothing.
    return this.starts(this.generateWith(kind, req, res, { body, requestId, prefiller, arrivedMs }));
  }

  private async generateWith(
    kind: ApiKind,
    req: IncomingMessage,
    res: ServerResponse,
    r: { body: Record<string, unknown>; requestId: string; prefiller: Prefiller | null; arrivedMs: number },
  ): Promise<void> {
    const { body, requestId, prefiller, arrivedMs } = r;
    if (prefiller === null) return this.generateFrom(kind, body, requestId, res);
    const { kv_role: kvRole, transfer_mode: mode } = this.opts.info;
    if (kvRole !== 'kv_consumer' || mode !== 'read')
      throw new HandoffError('BAD_REQUEST', `${PREFILLER_HEADER} needs a READ-mode decode instance`, {
        param: PREFILLER_HEADER,
      });
    // Refuse what this instance would refuse before the prefiller computes anything for nothing.
    validateApiRequest(kind, body, { maxModelLen: this.opts.maxModelLen });
    if (this.closing || this.draining) throw new HandoffError('OVERLOADED', 'the server is draining');
    const client = new AbortController();
    // Not res 'close' alone: a response pipelined behind another never gets it when the connection closes.
    onResponseGone(res, () => {
      if (!res.writableFinished) client.abort();
    });
    const auth = req.headers['authorization'];
    const call = {
      prefiller,
      path: pathOf(req),
      body,
      // The prefill leg's own id (the in-band cancel names it).
      headers: {
        'x-request-id': upstreamRequestId(requestId, this.env),
        ...(typeof auth === 'string' ? { authorization: auth } : {}),
      },
      signal: client.signal,
      timeoutMs: this.opts.sidecarTimeoutMs ?? 600_000,
    };
    await runSidecar(this.env, call, {
      // Admitted before any drain began: it runs to its end like the requests in `live`.
      // Its client waited for the prefill leg too: TTFT and e2e count from its arrival here.
      decode: (withParams) => this.generateFrom(kind, withParams, requestId, res, true, arrivedMs),
      releaseUnused: (params) => void this.engine.releaseUnused(params),
    });
  }

  /** The metrics' hooks of a generation starting now, for a request that arrived here at `arrivedMs`. */
  private observerOf(arrivedMs: number): GenerationObserver {
    // Time the request spent here before its generation started (an llm-d prefill leg) is part of its TTFT.
    const leadMs = this.env.nowMs() - arrivedMs;
    return {
      firstToken: (ms) => this.metrics.observeTtftMs(leadMs + ms),
      interToken: (ms) => this.metrics.observeItlMs(ms),
      finished: (reason, p, c) => this.metrics.observeFinished(reason, p, c, this.env.nowMs() - arrivedMs),
      prefixCache: (p, c) => this.metrics.observePrefixCache(p, c),
    };
  }

  /** The validated request checked against this server and tokenized; throws when it is refused here. */
  private async prepare(v: ValidatedRequest, res: ServerResponse, admitted: boolean): Promise<ApiRequest> {
    // An empty name means the served model, as an absent one does (vLLM's _is_model_supported).
    if (v.model !== null && v.model !== '' && v.model !== this.opts.modelName) {
      throw new HandoffError(
        'NOT_FOUND',
        `the model '${v.model}' does not exist (this server serves '${this.opts.modelName}')`,
        { param: 'model' },
      );
    }
    this.checkTransferRole(v.kvTransferParams);
    const promptTokenIds = 'ids' in v.prompt ? v.prompt.ids : await this.tokenizer.encode(v.prompt.text);
    // The connection too: a response queued behind another is not destroyed when its connection closes.
    if (res.destroyed || res.req.socket.destroyed)
      throw new HandoffError('REQUEST_ABORTED', 'the client went away while its prompt was tokenized');
    if (this.closing || (this.draining && !admitted))
      throw new HandoffError('OVERLOADED', this.draining ? 'the server is draining' : 'the server is shutting down');
    return tokenizedApiRequest(v, promptTokenIds, { maxModelLen: this.opts.maxModelLen });
  }

  /** A READ request refused before its engine saw it: prefill's pages for it are released (params checked first). */
  private releaseRefused(raw: unknown): void {
    let params: ReturnType<typeof parseKvTransferParams>;
    try {
      params = parseKvTransferParams(raw);
      // catch-ok: params that do not parse name no transfer to release; the request's own refusal is the answer
    } catch (e) {
      if (!(e instanceof HandoffError)) throw e;
      return;
    }
    if (params?.do_remote_prefill === true) this.engine.releaseUnused(params);
  }

  /** Validate, tokenize and run one completion here; resolves once it is under way (or refused). */
  private async generateFrom(
    kind: ApiKind,
    body: Record<string, unknown>,
    requestId: string,
    res: ServerResponse,
    admitted = false,
    arrivedAtMs: number | null = null,
  ): Promise<void> {
    const headers = { 'x-request-id': requestId };
    let api: ApiRequest;
    try {
      api = await this.prepare(validateApiRequest(kind, body, { maxModelLen: this.opts.maxModelLen }), res, admitted);
    } catch (e) {
      // It will never reach the engine: prefill's held pages go back now, not at its lease (vLLM #50425).
      // Also when a field was refused: a vLLM-style proxy asked prefill for max_tokens 1, stream off.
      this.releaseRefused(body['kv_transfer_params']);
      throw e;
    }
    const ctx: ResponseContext = {
      kind,
      requestId,
      createdSec: Math.floor(this.env.wallMs() / 1000),
      model: this.opts.modelName,
      logprobs: api.logprobs,
      returnTokenIds: api.returnTokenIds,
      promptTokenIds: api.promptTokenIds,
    };
    const onError = (e: HandoffError): void => this.metrics.countError(e.code);
    const raw = api.stream
      ? streamSink(res, ctx, api.includeUsage, headers, onError)
      : jsonSink(res, ctx, headers, onError);
    // Refusals found later by the engine or connector (a grant denied at the READ) name their field too.
    const attributed: GenerationSink = { ...raw, onError: (e) => raw.onError(attributeParam(e, kind)) };
    const sink = withStallBound(attributed, res, this.opts.clientStallMs ?? ANSWER_STALL_MS, this.env);
    const seed = api.seed ?? this.env.rng.int(2 ** 31);
    const observer = this.observerOf(arrivedAtMs ?? this.env.nowMs());
    const gen = new Generation(this.engine, api, requestId, seed, this.env, sink, observer);
    gen.start(); // throws (PROMPT_TOO_LONG, BAD_TRANSFER_PARAMS, duplicate id, ...) before anything is allocated
    this.live.set(gen, res);
    const cancelledAt = this.earlyCancels.get(requestId);
    this.earlyCancels.delete(requestId);
    if (cancelledAt !== undefined && this.env.nowMs() - cancelledAt < EARLY_CANCEL_MS) gen.cancelInBand();
    onResponseGone(res, () => {
      this.live.delete(gen);
      remember(this.recentlyDone, requestId, this.env.nowMs());
      if (!gen.done) {
        this.log?.info({ requestId }, 'client disconnected: aborting the request');
        gen.cancel();
      } else if (!res.writableFinished) {
        // Answered, but the client left before the answer was flushed: a prefill's pages held for decode
        // would wait for their lease, since nobody has the params to read or release them.
        this.log?.info({ requestId }, 'client disconnected before the answer was sent: ending its hold');
        gen.undelivered();
      }
    });
  }
}
