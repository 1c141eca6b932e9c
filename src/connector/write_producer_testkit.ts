/**
 * Prefill's WRITE-mode worker for the connector's tests: the real OneSidedConnectorWorker (producer, WRITE)
 * over a transfer engine that records the WRITEs posted (`h.posted`) and finishes one only when the test
 * calls `h.finishWrite()`, and the notifications it sends (`h.notified`). `step(n, fill)` builds a step's
 * scheduler output with its metadata, `notify` delivers a peer's notification, `destination()` is decode-0's
 * remote_blocks for transfer T.
 */
import { SimEnv } from '../util/env.ts';
import type { Device } from '../device/types.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig, type KVCacheConfig } from '../kv/spec.ts';
import type { TransferEngine, Notification } from '../transfer/core/types.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from './config.ts';
import type { PeerDirectory } from './peer_directory.ts';
import { OneSidedConnectorWorker } from './one_sided_worker.ts';
import { emptyOneSidedMetadata } from '../worker/connector_metadata.ts';
import { makeEmptySchedulerOutput } from '../worker/scheduler_output.ts';

type Handler = (from: string, n: Notification, grantEnded: boolean) => void;

export function writeProducerRig(kv: KVCacheConfig = makeKVCacheConfig(presetKVGroups('llama-mini', 16), 64)) {
  const env = new SimEnv(1);
  const h: {
    handler: Handler | null;
    finishWrite: (() => void) | null;
    posted: string[];
    notified: Array<{ to: string } & Notification>;
  } = { handler: null, finishWrite: null, posted: [], notified: [] };
  const transfer = {
    onNotification: (f: Handler) => ((h.handler = f), () => undefined),
    issueGrant: () => ({ token: 'ab'.repeat(16), expiresAtMs: 1e9 }),
    revokeGrant: () => true,
    drainGrant: () => Promise.resolve(),
    notify: (to: string, n: Notification) => (h.notified.push({ to, ...n }), Promise.resolve()),
    peerMetadata: () => ({
      engineId: 'decode-0',
      layout: {
        numSlabs: kv.numLayerSlabs * kv.tensorParallelSize,
        numBlocks: kv.numBlocks,
        pageBytes: kv.pageBytes,
        tensorParallelSize: kv.tensorParallelSize,
        blockSizes: kv.groups.map((g) => g.spec.blockSize),
      },
    }),
    postWrite: (w: { transferId: string }) => (h.posted.push(w.transferId), { id: 1 }),
    wait: () => new Promise<void>((resolve) => (h.finishWrite = resolve)),
    abort: () => Promise.resolve(),
  };
  const worker = new OneSidedConnectorWorker(
    { ...DEFAULT_ONE_SIDED_CONFIG, role: 'producer', mode: 'write' },
    kv,
    transfer as unknown as TransferEngine,
    {} as Device,
    kv.groups.map((g) => g.groupId),
    env,
    {} as PeerDirectory,
  );
  const step = (n: number, fill: (m: ReturnType<typeof emptyOneSidedMetadata>) => void) => {
    const so = makeEmptySchedulerOutput(n);
    const meta = emptyOneSidedMetadata();
    fill(meta);
    so.kvConnectorMetadata = meta;
    return so;
  };
  const notify = (from: string, n: Notification) => h.handler!(from, n, false);
  const destination = () =>
    notify('decode-0', {
      type: 'remote_blocks',
      transferId: 'T',
      payload: { blockIds: [[7, 8, 9]], skipBlocks: 0, endToken: 40, grant: 'cd'.repeat(16) },
    });
  return { h, worker, step, notify, destination };
}
