/**
 * A prefill and a decode engine in one process with real threads (threaded devices, inproc transfer
 * engine whose NIC is a worker thread), wired like a 1P1D deployment: each built by buildInstance (the
 * servers' composition root), the requests driven by pdFlow (the proxy's flow) with two in-process legs.
 */
import { assert } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';
import type { Env } from '../util/env.ts';
import { hexId } from '../util/ids.ts';
import type { ModelPreset } from '../kv/presets.ts';
import { DEFAULT_ONE_SIDED_CONFIG, type OneSidedConfig } from '../connector/config.ts';
import type { OneSidedConnector } from '../connector/factory.ts';
import type { KVTransferParams } from '../connector/params.ts';
import { buildInstance, type BuiltInstance } from '../engine/build_instance.ts';
import { threadedDevice } from '../engine/devices.ts';
import type { Device } from '../device/types.ts';
import type { EngineConfig, GenerateRequest, GenerateResult, LLMEngine } from '../engine/llm_engine.ts';
import { pdFlow, type PdLegs, type PdMode } from '../serve/pd_flow.ts';

export interface PdPairOptions {
  preset: ModelPreset;
  modelSeed: number;
  numBlocks: number;
  /** Decode-side connector settings (zeroExclusion, syncBeforeRead, mode). */
  decode: Partial<OneSidedConfig>;
  /** Prefill-side connector settings (leaseMs, faults...). */
  prefill?: Partial<OneSidedConfig>;
  raceCheck: boolean;
  scheduler?: EngineConfig['scheduler'];
  /** Decode only: scheduler settings over `scheduler` (e.g. lookahead tokens, as the simulator's decode). */
  decodeScheduler?: EngineConfig['scheduler'];
  /** Decode only: extra compute-stream time after each forward (a bigger model's forward). */
  decodeForwardPadMs?: number;
  /** Distinguishes engines of several pairs in one process (inproc registry). */
  name: string;
  /** Tensor parallel ranks of each side (default 1; they may differ: kv/tp_map.ts). */
  prefillTp?: number;
  decodeTp?: number;
  /** Tokens per KV page of each instance (default 16); they may differ (issue 14). */
  prefillBlockSize?: number;
  decodeBlockSize?: number;
  /** Decode's own Env (another host's clock, e.g. a skewed wall clock); default: the pair's. */
  decodeEnv?: Env;
}

function sideBlockSize(o: PdPairOptions, role: 'producer' | 'consumer'): { blockSize?: number } {
  const bs = role === 'producer' ? o.prefillBlockSize : o.decodeBlockSize;
  return bs === undefined ? {} : { blockSize: bs };
}

export class PdPair {
  private constructor(
    private readonly prefillSide: BuiltInstance<Device>,
    private readonly decodeSide: BuiltInstance<Device>,
    private readonly env: Env,
  ) {}

  static async create(o: PdPairOptions, env: Env): Promise<PdPair> {
    const build = (role: 'producer' | 'consumer', cfg: Partial<OneSidedConfig>, raceCheck: boolean) =>
      buildInstance(
        {
          preset: o.preset,
          modelSeed: o.modelSeed,
          numBlocks: o.numBlocks,
          ...sideBlockSize(o, role),
          tensorParallelSize: (role === 'producer' ? o.prefillTp : o.decodeTp) ?? 1,
          asyncScheduling: true,
          scheduler: { ...o.scheduler, ...(role === 'consumer' ? o.decodeScheduler : {}) },
          idlePollMs: 2,
          ...(role === 'consumer' && o.decodeForwardPadMs ? { forwardPadMs: o.decodeForwardPadMs } : {}),
          makeDevice: threadedDevice(o.preset, o.modelSeed, raceCheck),
          connector: {
            config: { ...DEFAULT_ONE_SIDED_CONFIG, ...cfg, role },
            endpoint: { backend: 'inproc', engineId: `${o.name}-${role}`, modelName: o.preset, preset: o.preset },
          },
        },
        role === 'consumer' ? (o.decodeEnv ?? env) : env,
      );
    const prefill = await build('producer', { mode: o.decode.mode ?? 'read', ...o.prefill }, false);
    const decode = await build('consumer', o.decode, o.raceCheck);
    return new PdPair(prefill, decode, env);
  }

  get prefill(): LLMEngine {
    return this.prefillSide.engine;
  }
  get decode(): LLMEngine {
    return this.decodeSide.engine;
  }

  /** The proxy's WRITE flow: both at once; prefill pushes into decode's pages when its forward is done. */
  generateWrite(g: GenerateRequest): Promise<GenerateResult> {
    return this.run('write', g).then(({ prefillParams: _p, ...result }) => result);
  }

  /** The proxy's READ flow; returns decode's result (and the params decode got, for inspection). */
  generate(
    g: GenerateRequest,
    onToken?: (atMs: number) => void,
  ): Promise<GenerateResult & { prefillParams: KVTransferParams }> {
    return this.run('read', g, onToken);
  }

  private run(
    mode: PdMode,
    g: GenerateRequest,
    onToken?: (atMs: number) => void,
  ): Promise<GenerateResult & { prefillParams: KVTransferParams }> {
    const legs: PdLegs<GenerateResult & { prefillParams: KVTransferParams }> = {
      // Each leg ends when the flow aborts it (WRITE: the other leg failed), as the proxy's legs do.
      prefill: (ask, signal) =>
        abortable(this.prefill, `pd-prefill-${hexId(this.env, 8)}`, signal, (requestId) =>
          this.prefill.generate({
            requestId,
            promptTokenIds: g.promptTokenIds,
            sampling: { ...g.sampling, maxTokens: ask.maxTokens },
            kvTransferParams: ask.kvTransferParams,
          }),
        ),
      decode: async (params, signal) => ({
        ...(await abortable(this.decode, g.requestId ?? `pd-decode-${hexId(this.env, 8)}`, signal, (requestId) =>
          this.decode.generate({ ...g, requestId, kvTransferParams: params }, onToken),
        )),
        prefillParams: params as KVTransferParams,
      }),
    };
    const addr = this.prefillConnector.transfer.address();
    const identity = {
      engineId: this.prefillConnector.transfer.engineId,
      sideChannelHost: addr.host,
      sideChannelPort: addr.port,
      transferMode: this.prefillMode,
    };
    return pdFlow(legs, { mode, transferId: `xfer-${hexId(this.env, 8)}`, prefill: identity });
  }

  private get prefillMode(): string {
    return this.prefillConnector.scheduler.config.mode;
  }

  get decodeConnector(): OneSidedConnector {
    return connectorOf(this.decodeSide);
  }
  get prefillConnector(): OneSidedConnector {
    return connectorOf(this.prefillSide);
  }

  async close(): Promise<void> {
    await this.decode.close();
    await this.prefill.close();
  }
}

/**
 * Run one leg under `requestId`; the flow's abort of the leg aborts the request (its pages are freed, a
 * prefill hold ends) and the leg rejects with REQUEST_ABORTED.
 */
async function abortable<T>(
  engine: LLMEngine,
  requestId: string,
  signal: AbortSignal,
  run: (requestId: string) => Promise<T>,
): Promise<T> {
  const stop = (): void => engine.abort(requestId);
  signal.addEventListener('abort', stop, { once: true });
  try {
    const result = await run(requestId);
    if (signal.aborted) throw new HandoffError('REQUEST_ABORTED', 'the flow aborted this leg');
    return result;
  } finally {
    signal.removeEventListener('abort', stop);
  }
}

function connectorOf(side: BuiltInstance<Device>): OneSidedConnector {
  assert(side.connector !== null, 'every instance of a P/D pair has a connector');
  return side.connector;
}
