/**
 * A prefill and a decode engine in one process with real threads (threaded devices, inproc transfer
 * engine whose NIC is a worker thread), wired like a 1P1D deployment: the proxy's READ flow is two
 * calls, prefill with max_tokens 1 + do_remote_decode, then decode with the returned params.
 */
import type { Env } from '../util/env.ts';
import { hexId } from '../util/ids.ts';
import type { ModelPreset } from '../kv/presets.ts';
import { createTransferEngine } from '../transfer/index.ts';
import { DEFAULT_ONE_SIDED_CONFIG, type OneSidedConfig } from '../connector/config.ts';
import { oneSidedConnectorFactory, type OneSidedConnector } from '../connector/factory.ts';
import type { KVTransferParams } from '../connector/params.ts';
import { threadedDevice } from '../engine/devices.ts';
import { LLMEngine, type EngineConfig, type GenerateRequest, type GenerateResult } from '../engine/llm_engine.ts';

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
  /** Decode only: extra compute-stream time after each forward (a bigger model's forward). */
  decodeForwardPadMs?: number;
  /** Distinguishes engines of several pairs in one process (inproc registry). */
  name: string;
}

export class PdPair {
  private constructor(
    readonly prefill: LLMEngine,
    readonly decode: LLMEngine,
    private readonly env: Env,
  ) {}

  static async create(o: PdPairOptions, env: Env): Promise<PdPair> {
    const base = {
      preset: o.preset,
      modelSeed: o.modelSeed,
      numBlocks: o.numBlocks,
      asyncScheduling: true,
      scheduler: o.scheduler ?? {},
      idlePollMs: 2,
    };
    const mk = (role: 'producer' | 'consumer', cfg: Partial<OneSidedConfig>, raceCheck: boolean) => {
      let engine: LLMEngine | null = null;
      const config: EngineConfig = {
        ...base,
        ...(role === 'consumer' && o.decodeForwardPadMs ? { forwardPadMs: o.decodeForwardPadMs } : {}),
        makeDevice: threadedDevice(o.preset, o.modelSeed, raceCheck),
        makeConnector: oneSidedConnectorFactory(
          { ...DEFAULT_ONE_SIDED_CONFIG, ...cfg, role },
          { backend: 'inproc', engineId: `${o.name}-${role}`, modelName: o.preset, preset: o.preset },
          createTransferEngine,
          { onActivity: () => engine?.core.kick() },
        ),
      };
      return LLMEngine.create(config, env).then((e) => (engine = e));
    };
    const prefill = await mk('producer', { mode: o.decode.mode ?? 'read', ...o.prefill }, false);
    const decode = await mk('consumer', o.decode, o.raceCheck);
    return new PdPair(prefill, decode, env);
  }

  /** The proxy's WRITE flow: both at once; prefill pushes into decode's pages when its forward is done. */
  async generateWrite(g: GenerateRequest): Promise<GenerateResult> {
    const transferId = `xfer-${hexId(this.env, 8)}`;
    const conn = this.prefillConnector.transfer;
    const addr = conn.address();
    const [, result] = await Promise.all([
      this.prefill.generate({
        promptTokenIds: g.promptTokenIds,
        sampling: { ...g.sampling, maxTokens: 1 },
        kvTransferParams: { do_remote_decode: true, do_remote_prefill: false, transfer_id: transferId },
      }),
      this.decode.generate({
        ...g,
        kvTransferParams: { do_remote_prefill: true, remote_engine_id: conn.engineId, remote_host: addr.host, remote_port: addr.port, transfer_id: transferId },
      }),
    ]);
    return result;
  }

  /** The proxy's READ flow; returns decode's result (and prefill's params for inspection). */
  async generate(g: GenerateRequest, onToken?: (atMs: number) => void): Promise<GenerateResult & { prefillParams: KVTransferParams }> {
    const transferId = `xfer-${hexId(this.env, 8)}`;
    const pre = await this.prefill.generate({
      promptTokenIds: g.promptTokenIds,
      sampling: { ...g.sampling, maxTokens: 1 },
      kvTransferParams: { do_remote_decode: true, do_remote_prefill: false, transfer_id: transferId },
    });
    const params = (pre.kvTransferParams ?? {}) as KVTransferParams;
    const result = await this.decode.generate({ ...g, kvTransferParams: params }, onToken);
    return { ...result, prefillParams: params };
  }

  get decodeConnector(): OneSidedConnector {
    return this.decode.connector as unknown as OneSidedConnector;
  }
  get prefillConnector(): OneSidedConnector {
    return this.prefill.connector as unknown as OneSidedConnector;
  }

  async close(): Promise<void> {
    await this.decode.close();
    await this.prefill.close();
  }
}
