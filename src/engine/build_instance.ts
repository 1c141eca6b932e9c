/**
 * buildInstance: the one composition root of a serving instance, used by the HTTP servers
 * (serve/instance.ts), the simulator (sim/instance.ts) and the in-process P/D pair (sim/pd_pair.ts):
 *
 *   ActivitySignal ─┐
 *   KV config ──> device ──> transfer engine ──> connector (scheduler side, worker side, PeerDirectory)
 *                                                        └──> scheduler, runner, EngineCore (subscribes)
 *
 * The callers differ only in what they inject: the device (threaded or sim), the transfer backend
 * (inproc/tcp over SharedArrayBuffers, or a sim engine on the simulator's fabric), and the configs.
 * The connector's activity (a transfer done, a peer answered) reaches the engine loop through the
 * ActivitySignal created first, so nothing is patched after construction.
 */
import { ActivitySignal } from '../util/activity.ts';
import type { Env } from '../util/env.ts';
import type { Logger } from '../util/log.ts';
import type { Device } from '../device/types.ts';
import type { KVCacheConfig } from '../kv/spec.ts';
import type { OneSidedConfig } from '../connector/config.ts';
import {
  oneSidedConnectorFactory,
  type CreateTransferEngine,
  type OneSidedConnector,
  type TransferEndpointOptions,
} from '../connector/factory.ts';
import type { PeerAllowList } from '../connector/peer_directory.ts';
import { kvCacheConfigOf, LLMEngine, schedulerConfigOf, type EngineConfig } from './llm_engine.ts';

export interface InstanceConnectorOptions {
  config: OneSidedConfig;
  endpoint: TransferEndpointOptions;
  /** Default: the endpoint's backend (inproc/tcp/sim) over the device's SharedArrayBuffers. */
  createTransfer?: CreateTransferEngine;
  /** Producers this instance may contact; default: this machine only. */
  allowedPeers?: PeerAllowList;
}

export interface BuildInstanceOptions<D extends Device> extends EngineConfig {
  makeDevice: (kvConfig: KVCacheConfig) => Promise<D>;
  /** null = colocated, no connector. */
  connector: InstanceConnectorOptions | null;
}

export interface BuiltInstance<D extends Device> {
  engine: LLMEngine;
  device: D;
  kvConfig: KVCacheConfig;
  connector: OneSidedConnector | null;
  activity: ActivitySignal;
}

export async function buildInstance<D extends Device>(
  opts: BuildInstanceOptions<D>,
  env: Env,
  log?: Logger,
): Promise<BuiltInstance<D>> {
  const { makeDevice, connector: connectorOpts, ...config } = opts;
  const activity = new ActivitySignal();
  const kvConfig = kvCacheConfigOf(config);
  const device = await makeDevice(kvConfig);
  let connector: OneSidedConnector | null = null;
  if (connectorOpts !== null) {
    const make = oneSidedConnectorFactory(connectorOpts.config, connectorOpts.endpoint, connectorOpts.createTransfer, {
      ...(log ? { log } : {}),
      onActivity: () => activity.notify(),
      ...(connectorOpts.allowedPeers ? { allowedPeers: connectorOpts.allowedPeers } : {}),
    });
    const numLookaheadTokens = schedulerConfigOf(config).numLookaheadTokens;
    connector = await make({ device, kvConfig, env, numLookaheadTokens, weightSeed: config.modelSeed });
  }
  const engine = LLMEngine.fromParts(config, { kvConfig, device, connector, activity }, env, log);
  return { engine, device, kvConfig, connector, activity };
}
