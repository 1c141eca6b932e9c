/**
 * Test kit for READ consumer tests against a PeerDirectory: a WorkerContext over llama-mini's KV groups (64
 * pages of 16 tokens unless told) whose transfer engine records the READs it is asked to post and settles
 * every wait, abort and notify at once (unless the test replaces them); peer geometry is fixed (64 pages
 * of 16 tokens), each READ is one empty work request, and no page has a clipped tail.
 */
import { SimEnv } from '../util/env.ts';
import { mutationsFor } from '../util/mutants.ts';
import type { Device } from '../device/types.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig, type KVCacheConfig } from '../kv/spec.ts';
import type { TransferEngine } from '../transfer/core/types.ts';
import { DEFAULT_ONE_SIDED_CONFIG, type OneSidedConfig } from './config.ts';
import type { PeerDirectory } from './peer_directory.ts';
import { WorkerContext } from './worker_context.ts';

export const HOST = '127.0.0.1';
export const PORT = 9;

/** Let the directory's handshake promises settle. */
export async function flush(): Promise<void> {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
}

/** The transfer engine's calls a test may replace (a producer that never answers, a recorded release). */
type TransferCalls = Partial<Record<'wait' | 'abort' | 'notify', (...args: never[]) => Promise<void>>>;

export function readContext(
  env: SimEnv,
  peers: PeerDirectory,
  o: { config?: OneSidedConfig; numBlocks?: number; transfer?: TransferCalls } = {},
): { ctx: WorkerContext; posted: string[]; kv: KVCacheConfig } {
  const kv = makeKVCacheConfig(presetKVGroups('llama-mini', 16), o.numBlocks ?? 64);
  const posted: string[] = [];
  const transfer = {
    postRead: (w: { transferId: string }) => (posted.push(w.transferId), { id: 'h' }),
    wait: () => Promise.resolve(),
    abort: () => Promise.resolve(),
    notify: () => Promise.resolve(),
    ...o.transfer,
  };
  const ctx = new WorkerContext(
    o.config ?? DEFAULT_ONE_SIDED_CONFIG,
    kv,
    transfer as unknown as TransferEngine,
    {} as unknown as Device,
    kv.groups.map((g) => g.groupId),
    env,
    peers,
    mutationsFor(undefined),
    undefined,
  );
  ctx.peerGeometry = () => ({ pageBytes: 0, numBlocks: 64, blockSizes: [16], tensorParallelSize: 1, numLayerSlabs: 1 });
  ctx.workRequestsFor = () => [{ ranges: [], footprint: [] }];
  ctx.clippedTails = () => [];
  return { ctx, posted, kv };
}
