/**
 * LLMEngine: one serving instance (colocated, prefill or decode) built from plain config: a device
 * (threaded or sim), the preset's KV cache, scheduler, runner, an optional connector, and the engine
 * loop. `generate()` streams a request's outputs; the servers, `handoff ab` and the tests use it.
 */
import { assert } from '../util/assert.ts';
import type { ActivitySignal } from '../util/activity.ts';
import type { Env } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { hexId } from '../util/ids.ts';
import type { Logger } from '../util/log.ts';
import type { Device } from '../device/types.ts';
import { KVCacheManager } from '../kv/kv_cache_manager.ts';
import type { KvEventPublisher } from '../kv/kv_events.ts';
import type { ModelPreset } from '../kv/presets.ts';
import { checkTensorParallelSize, presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig, type KVCacheConfig } from '../kv/spec.ts';
import { eosTokenIdOf, vocabSizeOf } from '../model/config.ts';
import { NullConnector, type ConnectorScheduler } from '../connector/base.ts';
import { parseKvTransferParams, type KVTransferParams } from '../connector/params.ts';
import type { ConnectorWorkerHooks } from '../worker/hooks.ts';
import { ModelRunner } from '../worker/model_runner.ts';
import type { SamplingParamsData } from '../worker/scheduler_output.ts';
import { EngineCore } from './engine_core.ts';
import { validatePromptTokenIds, validateSampling } from './request_validation.ts';
import type { EngineOutput } from './output.ts';
import { namesLiveTransfer, Request } from './request.ts';
import { DEFAULT_SCHEDULER_CONFIG, Scheduler, type SchedulerConfig } from './scheduler.ts';

export interface ConnectorPair {
  scheduler: ConnectorScheduler;
  worker: ConnectorWorkerHooks | null;
  close?(): Promise<void>;
}

export interface EngineConfig {
  preset: ModelPreset;
  modelSeed: number;
  numBlocks: number;
  /** Tokens per KV page (default 16, kv/presets.ts BLOCK_SIZE). */
  blockSize?: number;
  /** Tensor parallel ranks of the model and its cache (default 1; checked by checkTensorParallelSize). */
  tensorParallelSize?: number;
  asyncScheduling: boolean;
  scheduler: Partial<SchedulerConfig>;
  idlePollMs: number;
  /** A/B knob: extra stream time after each forward (see ModelRunner); omit in serving. */
  forwardPadMs?: number;
  /** Names this life of the instance in its KV events (a restart must use a new one); default 'engine'. */
  kvEventsEpoch?: string;
}

/** LLMEngine.create's config (tests): the device and an optional custom connector built by callbacks. */
export interface EngineCreateConfig extends EngineConfig {
  /** Builds the device for this KV config (threaded or sim). */
  makeDevice: (kvConfig: KVCacheConfig) => Promise<Device>;
  /** Builds the connector once the device exists; omitted for colocated serving. */
  makeConnector?: (ctx: {
    device: Device;
    kvConfig: KVCacheConfig;
    env: Env;
    numLookaheadTokens: number;
  }) => Promise<ConnectorPair>;
}

/** What the composition root (build_instance.ts) has built before the engine exists. */
export interface EngineParts {
  kvConfig: KVCacheConfig;
  device: Device;
  connector: ConnectorPair | null;
  /** Connector activity that wakes the engine loop. */
  activity?: ActivitySignal;
}

export function kvCacheConfigOf(config: EngineConfig): KVCacheConfig {
  const tp = checkTensorParallelSize(config.preset, config.tensorParallelSize ?? 1);
  return makeKVCacheConfig(presetKVGroups(config.preset, config.blockSize), config.numBlocks, tp);
}

export function schedulerConfigOf(config: EngineConfig): SchedulerConfig {
  return { ...DEFAULT_SCHEDULER_CONFIG, eosTokenId: eosTokenIdOf(config.preset), ...config.scheduler };
}

export interface GenerateRequest {
  requestId?: string;
  promptTokenIds: number[];
  sampling: Partial<SamplingParamsData> & { maxTokens: number };
  kvTransferParams?: KVTransferParams | null;
}

export class LLMEngine {
  private constructor(
    readonly config: EngineConfig,
    readonly kvConfig: KVCacheConfig,
    readonly device: Device,
    readonly kv: KVCacheManager,
    readonly scheduler: Scheduler,
    readonly runner: ModelRunner,
    readonly core: EngineCore,
    readonly connector: ConnectorPair | null,
    private readonly env: Env,
    /** The pool's KV events (BlockStored/BlockRemoved/AllBlocksCleared, vLLM's format), batched by sequence number. */
    readonly kvEvents: KvEventPublisher,
  ) {}

  /**
   * Unit tests' shortcut (a custom connector, no transfer engine). Servers and the simulator build
   * instances with buildInstance (build_instance.ts), the one composition root.
   */
  static async create(config: EngineCreateConfig, env: Env, log?: Logger): Promise<LLMEngine> {
    const kvConfig = kvCacheConfigOf(config);
    const device = await config.makeDevice(kvConfig);
    const numLookaheadTokens = schedulerConfigOf(config).numLookaheadTokens;
    const connector = config.makeConnector
      ? await config.makeConnector({ device, kvConfig, env, numLookaheadTokens })
      : null;
    return LLMEngine.fromParts(config, { kvConfig, device, connector }, env, log);
  }

  /** Scheduler, runner and engine loop over a device and connector that already exist. */
  static fromParts(config: EngineConfig, parts: EngineParts, env: Env, log?: Logger): LLMEngine {
    const { kvConfig, device, connector } = parts;
    assert(
      device.numBlocks === kvConfig.numBlocks && device.pageBytes === kvConfig.pageBytes,
      'device geometry must match the KV config',
    );
    const schedCfg = schedulerConfigOf(config);
    const kv = new KVCacheManager(kvConfig, { enableCaching: schedCfg.enablePrefixCaching });
    const kvEvents = kv.publishKvEvents({ epoch: config.kvEventsEpoch ?? 'engine', wallMs: () => env.wallMs() });
    const scheduler = new Scheduler(schedCfg, kv, connector?.scheduler ?? new NullConnector(), env);
    const runner = new ModelRunner(device, kvConfig, connector?.worker ?? null, config.forwardPadMs ?? 0);
    const core = new EngineCore(
      scheduler,
      runner,
      env,
      {
        asyncScheduling: config.asyncScheduling,
        idlePollMs: config.idlePollMs,
        ...(parts.activity ? { activity: parts.activity } : {}),
        ...(device.lost ? { deviceLost: device.lost } : {}),
      },
      log,
    );
    core.start();
    return new LLMEngine(config, kvConfig, device, kv, scheduler, runner, core, connector, env, kvEvents);
  }

  /** Build and validate a request; throws HandoffError (nothing allocated) on bad input. */
  makeRequest(g: GenerateRequest): Request {
    const params = g.kvTransferParams ?? null;
    // The engine's own check, not trusting the HTTP edge: nothing a client sent reaches the sampler's or
    // the model's assertions (or the Request constructor's) unchecked.
    validatePromptTokenIds(g.promptTokenIds, vocabSizeOf(this.config.preset));
    const prompt = this.connector?.scheduler.prefillPromptTokens(g.promptTokenIds, params) ?? g.promptTokenIds;
    const maxTokens = this.connector?.scheduler.prefillMaxTokens(g.sampling.maxTokens, params) ?? g.sampling.maxTokens;
    const sampling = {
      maxTokens,
      temperature: g.sampling.temperature ?? 0,
      topP: g.sampling.topP,
      topK: g.sampling.topK,
      seed: g.sampling.seed ?? 0,
      stopTokenIds: g.sampling.stopTokenIds ?? [],
      ignoreEos: g.sampling.ignoreEos ?? false,
    };
    validateSampling(sampling, vocabSizeOf(this.config.preset));
    const req = new Request({
      requestId: g.requestId ?? `req-${hexId(this.env, 8)}`,
      promptTokenIds: prompt,
      sampling,
      kvTransferParams: params ? { ...params } : null,
      arrivalMs: this.env.nowMs(),
    });
    try {
      this.connector?.scheduler.validateRequest(req);
    } catch (e) {
      this.releaseRefused(req);
      throw e;
    }
    return req;
  }

  /**
   * A refused request gives its producer the pages back now, unless a live request here names the same
   * transfer (a retry under the same id or params): that one still reads the pages, and releases them itself.
   */
  private releaseRefused(req: Request): void {
    if (namesLiveTransfer(req, req.kvTransferParams, this.scheduler.requests.values())) return;
    if (this.connector?.scheduler.releaseUnused(req)) this.core.kick();
  }

  /** Submit a request; outputs arrive on `onOutput`, the last with a finishReason. */
  submit(g: GenerateRequest, onOutput: (o: EngineOutput) => void): Request {
    const req = this.makeRequest(g);
    try {
      if (this.scheduler.requests.has(req.requestId))
        throw new HandoffError('BAD_REQUEST', `duplicate request id ${req.requestId}`);
      this.checkLiveTransferId(req);
      this.core.addRequest(req, onOutput);
    } catch (e) {
      // Refused after prefill answered (too long, out of pages...): give the producer its pages back now.
      this.releaseRefused(req);
      throw e;
    }
    return req;
  }

  /**
   * A prefill half whose transfer_id a live prefill half here names too: both would lend pages under one
   * id, the later grant replacing the earlier (whose decode then failed with GRANT_DENIED). The connector
   * refuses ids of pages already lent (validateRequest); this covers requests not finished yet.
   */
  private checkLiveTransferId(req: Request): void {
    const id = req.kvTransferParams?.do_remote_decode ? req.kvTransferParams.transfer_id : undefined;
    if (typeof id !== 'string') return;
    for (const other of this.scheduler.requests.values())
      if (other.kvTransferParams?.do_remote_decode && other.kvTransferParams.transfer_id === id)
        throw new HandoffError(
          'BAD_TRANSFER_PARAMS',
          `transfer_id '${id.slice(0, 80)}' is in use by request ${other.requestId.slice(0, 80)}`,
          { param: 'kv_transfer_params.transfer_id' },
        );
  }

  /**
   * Run a request to the end and collect everything (tests, the A/B, the bench); `onToken` sees each token's arrival
   * time.
   */
  generate(g: GenerateRequest, onToken?: (atMs: number) => void): Promise<GenerateResult> {
    return new Promise((resolve, reject) => {
      const tokens: number[] = [];
      const hashes: Array<string | null> = [];
      const logprobs: Array<number | null> = [];
      let nan = false;
      try {
        this.submit(g, (o) => {
          if (o.newTokenIds.length > 0) onToken?.(this.env.nowMs());
          tokens.push(...o.newTokenIds);
          hashes.push(...o.logitsHashes);
          logprobs.push(...o.newLogprobs);
          nan ||= o.nanLogits;
          if (o.finishReason === null) return;
          if (o.error) reject(o.error);
          else
            resolve({
              tokenIds: tokens,
              logitsHashes: hashes,
              logprobs,
              finishReason: o.finishReason,
              kvTransferParams: o.kvTransferParams,
              nanLogits: nan,
              numExternalTokens: o.numExternalTokens,
            });
        });
      } catch (e) {
        reject(e);
      }
    });
  }

  /**
   * The client went away: abort the request, or end its hold if it finished holding pages for a peer.
   * `only` (a request submit returned): leave another request that reuses the id alone.
   */
  abort(requestId: string, only?: object): void {
    this.core.abort(requestId, true, only);
  }

  /**
   * Abort the request if it has not finished; once finished it is left alone (its answer, and any pages
   * it holds for a peer, are still on their way to the client: in-band cancel, /handoff/cancel).
   */
  cancel(requestId: string): void {
    this.core.abort(requestId, false);
  }

  /**
   * A READ request that will never be submitted here (its client went away after prefill answered):
   * send the producer its release now, so its pages do not wait for the lease. Only the transfer params
   * are used; the release carries their grant, which the producer checks. True if a release was queued.
   */
  releaseUnused(kvTransferParams: unknown): boolean {
    const params = parseKvTransferParams(kvTransferParams);
    // Not a transfer a live request here loads (WRITE: prefill would drop its push; the release names it alone).
    if (namesLiveTransfer(this, params, this.scheduler.requests.values())) return false;
    const req = { requestId: 'release-unused', numPromptTokens: 0, numTokens: 0, status: 'FINISHED_ABORTED' };
    const queued = params !== null && this.connector?.scheduler.releaseUnused({ ...req, kvTransferParams: params });
    if (queued) this.core.kick();
    return queued ?? false;
  }

  async close(): Promise<void> {
    const stopped = this.core.stop(); // schedules no further step
    // A step awaiting READs from a hung producer would hold the loop until its deadline (30 s by default).
    this.connector?.worker?.abandonLoads?.();
    await stopped;
    await this.connector?.close?.();
    await this.device.close();
  }
}

export interface GenerateResult {
  tokenIds: number[];
  logitsHashes: Array<string | null>;
  logprobs: Array<number | null>;
  finishReason: string;
  kvTransferParams: Record<string, unknown> | null;
  nanLogits: boolean;
  numExternalTokens: number;
}
