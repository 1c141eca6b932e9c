/**
 * A WRITE pair for the engine's tests: decode's real scheduler (with its one-sided connector) and prefill's
 * real worker side, over a transfer engine that records the WRITEs prefill posts. Prefill already holds
 * transfer T (request R, pages [1, 2, 3], final) and waits for decode to say where to write it.
 */
import { SimEnv } from '../util/env.ts';
import type { Device } from '../device/types.ts';
import type { TransferEngine, Notification } from '../transfer/core/types.ts';
import { makeScheduler } from './scheduler_testkit.ts';
import { emptyOneSidedMetadata } from '../worker/connector_metadata.ts';
import { makeEmptySchedulerOutput } from '../worker/scheduler_output.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from '../connector/config.ts';
import { OneSidedConnectorScheduler } from '../connector/one_sided_scheduler.ts';
import { OneSidedConnectorWorker } from '../connector/one_sided_worker.ts';
import type { PeerDirectory } from '../connector/peer_directory.ts';

/** Prefill's worker side (WRITE producer) over a transfer engine that records the WRITEs posted. */
export function producerWorker(kv: ReturnType<typeof makeScheduler>['kv']) {
  let handler: ((from: string, n: Notification) => void) | null = null;
  const posted: string[] = [];
  const cfg = kv.config;
  const transfer = {
    onNotification: (h: (from: string, n: Notification) => void) => ((handler = h), () => undefined),
    revokeGrant: () => true,
    drainGrant: () => Promise.resolve(),
    notify: () => Promise.resolve(),
    peerMetadata: () => ({
      engineId: 'decode-0',
      layout: {
        numSlabs: cfg.numLayerSlabs * cfg.tensorParallelSize,
        numBlocks: cfg.numBlocks,
        pageBytes: cfg.pageBytes,
        tensorParallelSize: cfg.tensorParallelSize,
        blockSizes: cfg.groups.map((g) => g.spec.blockSize),
      },
    }),
    postWrite: (w: { transferId: string }) => (posted.push(w.transferId), { id: 1 }),
    wait: () => new Promise<void>(() => undefined),
    abort: () => Promise.resolve(),
  };
  const worker = new OneSidedConnectorWorker(
    { ...DEFAULT_ONE_SIDED_CONFIG, role: 'producer', mode: 'write' },
    cfg,
    transfer as unknown as TransferEngine,
    {} as Device,
    cfg.groups.map((g) => g.groupId),
    new SimEnv(2),
    {} as PeerDirectory,
  );
  return { worker, posted, notify: (n: Notification) => handler!('decode-0', n) };
}

/** Decode's scheduler in WRITE mode, and prefill holding T for it; `params()` names T (a fresh object each call). */
export async function writePairWithHeldTransfer() {
  const { scheduler, kv } = makeScheduler({
    preset: 'llama-mini',
    numBlocks: 64,
    connector: (env, kv) =>
      new OneSidedConnectorScheduler(
        { ...DEFAULT_ONE_SIDED_CONFIG, role: 'consumer', mode: 'write' },
        kv.config,
        env,
        { engineId: 'decode-0', host: '127.0.0.1', port: 7 },
        null,
      ),
  });
  const prefill = producerWorker(kv);
  const so1 = makeEmptySchedulerOutput(1);
  so1.kvConnectorMetadata = {
    ...emptyOneSidedMetadata(),
    sendTransfers: { T: 'R' },
    reqsToSave: [{ requestId: 'R', transferId: 'T', localBlockIds: [[1, 2, 3]] }],
  };
  await prefill.worker.preForward(so1);
  const params = () => ({
    do_remote_prefill: true,
    remote_engine_id: 'prefill-0',
    remote_host: '127.0.0.1',
    remote_port: 5,
    transfer_id: 'T',
  });
  return { scheduler, kv, prefill, params };
}
