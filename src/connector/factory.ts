/**
 * Builds a OneSidedConnector (scheduler side + worker side + PeerDirectory) and its transfer engine for
 * an engine whose device exists: the transfer engine registers the device's slabs, the race checker (if
 * on) sees the NIC's accesses, and the producer's kv_transfer_params advertise this engine's side-channel
 * address. The slabs go to the transfer engine as views (`slabViews`); each backend takes what it needs:
 * the sim engine works on the views, the inproc/tcp engines need the SharedArrayBuffers behind them
 * (createTransferEngineOverViews, and createTransferEngine asserts it).
 */
import { assert } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import type { Logger } from '../util/log.ts';
import type { Device } from '../device/types.ts';
import type { KVCacheConfig } from '../kv/spec.ts';
import { createTransferEngine } from '../transfer/factory.ts';
import { layoutFromKvConfig } from '../transfer/core/metadata.ts';
import type { TransferBackend, TransferEngine, TransferEngineOptions } from '../transfer/core/types.ts';
import { mutationsFor } from '../util/mutants.ts';
import type { OneSidedConfig } from './config.ts';
import { OneSidedConnectorScheduler } from './one_sided_scheduler.ts';
import { OneSidedConnectorWorker } from './one_sided_worker.ts';
import { LOOPBACK_PEERS, PeerDirectory, type PeerAllowList } from './peer_directory.ts';

export interface TransferEndpointOptions {
  backend: TransferBackend;
  engineId: string;
  modelName: string;
  preset: string;
  host?: string;
  port?: number;
  dataPort?: number;
  sideChannelSecret?: string;
}

export interface ConnectorContext {
  device: Device;
  kvConfig: KVCacheConfig;
  env: Env;
  numLookaheadTokens: number;
  /** The model's weight seed: part of what a peer must share (transfer/core/metadata.ts). */
  weightSeed: number;
}

export interface OneSidedConnector {
  scheduler: OneSidedConnectorScheduler;
  peers: PeerDirectory;
  worker: OneSidedConnectorWorker;
  transfer: TransferEngine;
  close(): Promise<void>;
}

/** A transfer engine's options as the connector knows them: the device's slabs as views. */
export type ConnectorTransferOptions = Omit<TransferEngineOptions, 'slabs'> & { slabViews: Uint8Array[] };

export type CreateTransferEngine = (opts: ConnectorTransferOptions) => Promise<TransferEngine>;

/** The inproc/tcp path: those NICs share the slabs' SharedArrayBuffers (asserted by createTransferEngine). */
export const createTransferEngineOverViews: CreateTransferEngine = ({ slabViews, ...rest }) => {
  for (const [i, v] of slabViews.entries()) {
    assert(v.byteOffset === 0 && v.byteLength === v.buffer.byteLength, `slab view ${i} must span its whole buffer`);
  }
  return createTransferEngine({ ...rest, slabs: slabViews.map((v) => v.buffer as SharedArrayBuffer) });
};

export function oneSidedConnectorFactory(
  config: OneSidedConfig,
  endpoint: TransferEndpointOptions,
  createTransfer: CreateTransferEngine = createTransferEngineOverViews,
  opts: { log?: Logger; onActivity?: () => void; allowedPeers?: PeerAllowList } = {},
): (ctx: ConnectorContext) => Promise<OneSidedConnector> {
  return async ({ device, kvConfig, env, numLookaheadTokens, weightSeed }) => {
    const transfer = await createTransfer({
      backend: endpoint.backend,
      env,
      engineId: endpoint.engineId,
      modelName: endpoint.modelName,
      preset: endpoint.preset,
      weightSeed,
      // Geometry and page formats: a peer with other block sizes maps tokens through them (issue 14).
      ...layoutFromKvConfig(kvConfig),
      slabViews: device.slabs,
      ...(endpoint.host !== undefined ? { host: endpoint.host } : {}),
      ...(endpoint.port !== undefined ? { port: endpoint.port } : {}),
      ...(endpoint.dataPort !== undefined ? { dataPort: endpoint.dataPort } : {}),
      ...(endpoint.sideChannelSecret !== undefined ? { sideChannelSecret: endpoint.sideChannelSecret } : {}),
      ...(config.faults ? { faults: config.faults } : {}),
      // Mutant slot-leak-on-fail: the transfer engine core loses the slot of each failed work request.
      ...(mutationsFor(config.mutant).freeSlotsOfFailedWork
        ? {}
        : { faults: { ...config.faults, leakFailedSlots: true } }),
    });
    transfer.attachRaceChecker(device.raceChecker);
    const addr = transfer.address();
    const peers = new PeerDirectory(
      (p) => transfer.handshake(p),
      env,
      opts.allowedPeers ?? LOOPBACK_PEERS,
      () => opts.onActivity?.(),
    );
    const scheduler = new OneSidedConnectorScheduler(
      config,
      kvConfig,
      env,
      { engineId: transfer.engineId, host: addr.host, port: addr.port },
      transfer,
      numLookaheadTokens,
      peers,
    );
    const worker = new OneSidedConnectorWorker(
      config,
      kvConfig,
      transfer,
      device,
      scheduler.transferGroupIds,
      env,
      peers,
      opts.log,
      opts.onActivity,
    );
    return {
      scheduler,
      peers,
      worker,
      transfer,
      close: async () => {
        worker.close();
        await transfer.close();
      },
    };
  };
}
