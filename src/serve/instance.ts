/**
 * startInstance: one serving instance from plain options: an engine on the threaded device, the
 * OneSidedConnector with its transfer engine for prefill/decode (tcp between processes), both built by
 * buildInstance (engine/build_instance.ts, the composition root the simulator uses too), and the
 * InstanceServer in front. `--role` sets the default kv_role of `--kv-transfer-config`; a colocated
 * instance (`both`) runs without a connector unless a config asks for one.
 */
import type { RaceChecker } from '../device/race/race_checker.ts';
import type { Device } from '../device/types.ts';
import type { KVCacheConfig } from '../kv/spec.ts';
import type { Env } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { hexId } from '../util/ids.ts';
import type { Logger } from '../util/log.ts';
import { presetKVGroups, type ModelPreset } from '../kv/presets.ts';
import { kvEventEpoch } from '../kv/kv_events.ts';
import type { TransferBackend } from '../transfer/core/types.ts';
import { parseKvTransferConfig, type OneSidedConfig } from '../connector/config.ts';
import type { OneSidedConnector } from '../connector/factory.ts';
import { simDevice, threadedDevice } from '../engine/devices.ts';
import { LOOPBACK_PEERS, type PeerAllowList } from '../connector/peer_directory.ts';
import { buildInstance, type InstanceConnectorOptions } from '../engine/build_instance.ts';
import type { LLMEngine } from '../engine/llm_engine.ts';
import { attachLifecycleOracle } from '../engine/lifecycle_oracle.ts';
import { DEFAULT_SCHEDULER_CONFIG, type SchedulerConfig } from '../engine/scheduler_config.ts';
import {
  InstanceServer,
  type InstanceInfo,
  type InstanceServerOptions,
  type ServedEngine,
  type ServeRole,
} from './instance_server.ts';
import type { InstanceStatsSnapshot } from './metrics.ts';
import type { InstanceLoad } from './kv_event_stream.ts';

export interface InstanceOptions {
  role: ServeRole;
  preset: ModelPreset;
  host: string;
  /** 0 = a free port. */
  port: number;
  numBlocks: number;
  /** Tokens per KV page; prefill and decode may differ (the connector maps tokens between sizes, issue 14). */
  blockSize: number;
  /** Ranks the model and its cache are split over; prefill and decode may differ (P/D between degrees). */
  tensorParallelSize: number;
  modelSeed: number;
  raceCheck: boolean;
  /** vLLM-style kv_transfer_config (JSON text or object); null = the role's default. */
  kvTransferConfig: string | Record<string, unknown> | null;
  transferBackend: TransferBackend;
  /** Interface the side channel and data plane bind to (and advertise). */
  transferHost: string;
  transferPort: number;
  transferDataPort: number;
  sideChannelSecret: string | null;
  scheduler: Partial<Pick<SchedulerConfig, 'maxNumSeqs' | 'maxNumBatchedTokens' | 'maxModelLen'>>;
  apiKey: string | null;
  /** 'sim' runs the model in process (tests of colocated serving); P/D needs 'threaded'. */
  device: 'threaded' | 'sim';
  /** Producers a decode instance may contact (`--kv-peers`); default: this machine only. */
  kvPeers?: PeerAllowList;
  /** The device's kernel module (default: the model's step kernel); tests inject failing kernels here. */
  kernelModuleUrl?: string;
  /** A finished answer its client takes no byte of for this long is dropped (InstanceServer). */
  clientStallMs?: number;
}

export const DEFAULT_INSTANCE_OPTIONS: InstanceOptions = {
  role: 'both',
  preset: 'dsv4-mini',
  host: '127.0.0.1',
  port: 8000,
  numBlocks: 1024,
  blockSize: 16,
  tensorParallelSize: 1,
  modelSeed: 0,
  raceCheck: false,
  kvTransferConfig: null,
  transferBackend: 'tcp',
  transferHost: '127.0.0.1',
  transferPort: 0,
  transferDataPort: 0,
  sideChannelSecret: null,
  scheduler: {},
  apiKey: null,
  device: 'threaded',
};

const ROLE_TO_KV_ROLE = { prefill: 'kv_producer', decode: 'kv_consumer', both: 'kv_both' } as const;

/** The connector config for a role: null = no connector (colocated without a config). */
export function resolveTransferConfig(
  role: ServeRole,
  raw: string | Record<string, unknown> | null,
): OneSidedConfig | null {
  if (raw === null) return role === 'both' ? null : parseKvTransferConfig({ kv_role: ROLE_TO_KV_ROLE[role] }).config;
  let obj: unknown = raw;
  if (typeof raw === 'string') {
    try {
      obj = JSON.parse(raw);
    } catch (e) {
      if (!(e instanceof SyntaxError)) throw e;
      throw new HandoffError('BAD_CONFIG', `--kv-transfer-config is not valid JSON: ${(e as Error).message}`);
    }
  }
  if (obj === null || typeof obj !== 'object' || Array.isArray(obj))
    throw new HandoffError('BAD_CONFIG', '--kv-transfer-config must be a JSON object');
  const withRole = { kv_role: ROLE_TO_KV_ROLE[role], ...(obj as Record<string, unknown>) };
  if (withRole.kv_role !== ROLE_TO_KV_ROLE[role]) {
    throw new HandoffError(
      'BAD_CONFIG',
      `kv_role '${String(withRole.kv_role)}' contradicts --role ${role} (expected '${ROLE_TO_KV_ROLE[role]}')`,
    );
  }
  const parsed = parseKvTransferConfig(withRole);
  return parsed.connector === 'NullConnector' ? null : parsed.config;
}

export interface Instance {
  engine: LLMEngine;
  server: InstanceServer;
  url: string;
  info: InstanceInfo;
  close(): Promise<void>;
  /** Drain (no new requests; in-flight requests and held pages finish, bounded by timeoutMs), then close. */
  drainAndClose(timeoutMs: number): Promise<boolean>;
}

/**
 * The pages (with the null block) one request of maxModelLen tokens needs alone, as the engine counts it
 * (request_validation.ts pagesNeeded): a page per blockSize tokens in every attention group, one state
 * page per Mamba group.
 */
export function pagesForOneRequest(preset: ModelPreset, maxModelLen: number, blockSize: number): number {
  return presetKVGroups(preset, blockSize).reduce(
    (n, g) => n + (g.spec.type === 'mamba' ? 1 : Math.ceil(maxModelLen / g.spec.blockSize)),
    1,
  );
}

function checkCapacity(preset: ModelPreset, numBlocks: number, maxModelLen: number, blockSize: number): void {
  const need = pagesForOneRequest(preset, maxModelLen, blockSize);
  if (numBlocks < need) {
    throw new HandoffError(
      'BAD_CONFIG',
      `--num-blocks ${numBlocks} cannot hold one request of --max-model-len ${maxModelLen} tokens (needs >= ${need})`,
    );
  }
}

export async function startInstance(opts: InstanceOptions, env: Env, log?: Logger): Promise<Instance> {
  const transferConfig = resolveTransferConfig(opts.role, opts.kvTransferConfig);
  const scheduler = { ...opts.scheduler };
  const maxModelLen = scheduler.maxModelLen ?? DEFAULT_SCHEDULER_CONFIG.maxModelLen;
  checkCapacity(opts.preset, opts.numBlocks, maxModelLen, opts.blockSize);
  if (transferConfig && opts.device !== 'threaded')
    throw new HandoffError('BAD_CONFIG', 'P/D serving needs the threaded device');
  const engineId = `${opts.role}-${hexId(env, 6)}`;
  const built = await buildInstance(
    {
      preset: opts.preset,
      modelSeed: opts.modelSeed,
      numBlocks: opts.numBlocks,
      blockSize: opts.blockSize,
      tensorParallelSize: opts.tensorParallelSize,
      asyncScheduling: true,
      scheduler,
      idlePollMs: 5,
      kvEventsEpoch: kvEventEpoch(env.wallMs(), engineId),
      makeDevice: deviceFactory(opts),
      connector: transferConfig && connectorOptions(opts, transferConfig, engineId),
    },
    env,
    log,
  );
  const { engine: e, connector } = built;
  const lifecycle = opts.raceCheck
    ? attachLifecycleOracle(e, engineId, (v) =>
        log?.error({ invariant: v.invariant, block: v.block }, `page lifecycle violation: ${v.message}`),
      )
    : null;
  const info = {
    ...instanceInfo(opts, transferConfig, connector ? engineId : null, connector, maxModelLen),
    prefix_cache_groups: e.kv.prefixCacheGroups(),
    kv_events_epoch: e.kvEvents.epoch,
  };
  const readStats = (): InstanceStatsSnapshot => ({
    ...snapshot(e, connector),
    lifecycleViolations: lifecycle?.violations() ?? null,
  });
  const server = new InstanceServer(servedEngine(e), serverOptions(opts, maxModelLen, info), env, readStats, log);
  const port = await listenOrClose(server, e, opts);
  const hostForUrl = opts.host.includes(':') ? `[${opts.host}]` : opts.host;
  return {
    engine: e,
    server,
    url: `http://${hostForUrl}:${port}`,
    info,
    close: async () => {
      await server.close();
      await e.close();
    },
    drainAndClose: async (timeoutMs) => {
      const drained = await server.drain(timeoutMs);
      await server.close();
      await e.close();
      return drained;
    },
  };
}

function serverOptions(opts: InstanceOptions, maxModelLen: number, info: InstanceInfo): InstanceServerOptions {
  return {
    modelName: opts.preset,
    apiKey: opts.apiKey,
    maxModelLen,
    info,
    prefillerPeers: opts.kvPeers ?? LOOPBACK_PEERS,
    ...(opts.clientStallMs !== undefined ? { clientStallMs: opts.clientStallMs } : {}),
  };
}

/** What the HTTP server drives: the engine's submit/abort/release, its KV events and load. */
function servedEngine(e: LLMEngine): ServedEngine {
  return {
    submit: e.submit.bind(e),
    abort: e.abort.bind(e),
    cancel: e.cancel.bind(e),
    releaseUnused: e.releaseUnused.bind(e),
    kvEvents: e.kvEvents,
    load: () => loadOf(e),
    resetPrefixCache: () => e.kv.resetPrefixCache(),
    get crashed() {
      return e.core.crashed;
    },
  };
}

/** The instance's device: the threaded one, or the in-process sim device. */
function deviceFactory(opts: InstanceOptions): (kv: KVCacheConfig) => Promise<Device> {
  return opts.device === 'threaded'
    ? threadedDevice(opts.preset, opts.modelSeed, opts.raceCheck, opts.kernelModuleUrl)
    : simDevice(opts.preset, opts.modelSeed, {
        raceCheck: opts.raceCheck,
        ...(opts.kernelModuleUrl === undefined ? {} : { kernelModuleUrl: opts.kernelModuleUrl }),
      });
}

/** Listen on the instance's port; when that fails the engine is closed before the error propagates. */
async function listenOrClose(server: InstanceServer, engine: LLMEngine, opts: InstanceOptions): Promise<number> {
  try {
    return await server.listen(opts.port, opts.host);
  } catch (err) {
    await engine.close();
    throw err;
  }
}

/** The connector of a P/D instance: its transfer endpoint and the producers it may contact. */
function connectorOptions(opts: InstanceOptions, config: OneSidedConfig, engineId: string): InstanceConnectorOptions {
  return {
    config,
    endpoint: {
      backend: opts.transferBackend,
      engineId,
      modelName: opts.preset,
      preset: opts.preset,
      host: opts.transferHost,
      port: opts.transferPort,
      dataPort: opts.transferDataPort,
      ...(opts.sideChannelSecret !== null ? { sideChannelSecret: opts.sideChannelSecret } : {}),
    },
    ...(opts.kvPeers ? { allowedPeers: opts.kvPeers } : {}),
  };
}

/** What GET /handoff/info reports: role, model, and where a peer reaches this instance's transfer engine. */
function instanceInfo(
  opts: InstanceOptions,
  transferConfig: OneSidedConfig | null,
  engineId: string | null,
  connector: OneSidedConnector | null,
  maxModelLen: number,
): Omit<InstanceInfo, 'prefix_cache_groups' | 'kv_events_epoch'> {
  const addr = connector?.transfer.address() ?? null;
  const ports = connector?.transfer.ports() ?? null;
  return {
    engine_id: engineId,
    role: opts.role,
    model: opts.preset,
    preset: opts.preset,
    kv_role: transferConfig ? ROLE_TO_KV_ROLE[opts.role] : null,
    transfer_mode: transferConfig?.mode ?? null,
    side_channel_host: addr?.host ?? null,
    side_channel_port: addr?.port ?? null,
    data_port: ports?.data ?? null,
    max_model_len: maxModelLen,
    num_pages: opts.numBlocks - 1,
    block_size: opts.blockSize,
    compat_hash: connector?.transfer.metadata.compatHash ?? null,
  };
}

/** What a router weighs: queued and running requests, pages held for a peer, free pages. */
function loadOf(e: LLMEngine): InstanceLoad {
  return {
    running: e.scheduler.numRunning,
    waiting: e.scheduler.numWaiting,
    held_for_send: e.scheduler.numHeldForSend,
    held_for_send_pages: e.scheduler.transfers.numHeldPages,
    free_pages: e.kv.getNumFreeBlocks(),
    total_pages: e.kvConfig.numBlocks - 1,
  };
}

function snapshot(e: LLMEngine, c: OneSidedConnector | null): InstanceStatsSnapshot {
  const s = e.scheduler.stats;
  return {
    running: e.scheduler.numRunning,
    waiting: e.scheduler.numWaiting,
    heldForSend: e.scheduler.numHeldForSend,
    kvUsage: e.kv.usage(),
    freePages: e.kv.getNumFreeBlocks(),
    totalPages: e.kvConfig.numBlocks - 1,
    preemptions: s.preemptions,
    pagesZeroListed: s.pagesZeroListed,
    pagesExcludedFromZeroing: s.pagesExcludedFromZeroing,
    pagesZeroed: e.runner.stats.pagesZeroed,
    pagesTailZeroed: c?.worker.stats.tailsZeroed ?? 0,
    kvLoadFailures: s.loadFailures,
    leasesExpired: c?.scheduler.stats.leasesExpired ?? 0,
    holdsEnded: c?.scheduler.stats.holdsEnded ?? 0,
    engineSteps: e.core.stats.steps,
    transfer: c ? c.transfer.stats() : null,
    races: e.device.raceChecker
      ? (e.device.raceChecker as RaceChecker).races().length +
        (e.device.raceChecker as RaceChecker).stats().droppedReports
      : null,
    drainReadLatenciesMs: () => (c ? c.worker.drainReadLatencies() : []),
  };
}
