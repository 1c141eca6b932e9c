/**
 * Async scheduling runs step N's postForward (which settles the READs a mutant left in flight,
 * settleLateReads) while step N+1's preForward awaits that step's READs. settleLateReads took every
 * *landed* READ of the table, so it took, released and removed step N+1's READs that had already landed,
 * such as an empty READ (decode's prefix cache holds every token prefill would send: it lands at post)
 * posted behind one still in flight; step N+1 then removed it again and the engine loop crashed on the
 * assertion `READ consumer: no transfer ... to be defined`. Found by a READ soak (prefill TP 2 at 32
 * tokens per page, decode at 8, 72 pages, shared prefixes, 24 clients, 30% of them leaving): decode
 * died after ~20 s and every later request failed. This proves the interleaving on the ReadConsumer
 * with a transfer engine whose READ lands when the test says: no crash, each READ released once.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import { mutationsFor } from '../util/mutants.ts';
import type { Device } from '../device/types.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import type { TransferEngine } from '../transfer/core/types.ts';
import type { RecvReqMeta } from '../worker/connector_metadata.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from './config.ts';
import type { PeerDirectory } from './peer_directory.ts';
import { ReadConsumer } from './read_consumer.ts';
import { WorkerContext } from './worker_context.ts';

function rig() {
  const env = new SimEnv(1);
  const kv = makeKVCacheConfig(presetKVGroups('llama-mini', 16), 64);
  const released: string[] = [];
  let land!: () => void;
  const landed = new Promise<void>((r) => (land = r));
  const transfer = {
    postRead: () => ({ id: 'h1' }),
    wait: () => landed,
    abort: () => Promise.resolve(),
    notify: (_peer: string, n: { transferId: string }) => (released.push(n.transferId), Promise.resolve()),
  };
  const peers = {
    readyEngine: () => 'prefill-0',
    resolve: () => Promise.resolve('prefill-0'),
    forget: () => undefined,
  };
  const ctx = new WorkerContext(
    DEFAULT_ONE_SIDED_CONFIG,
    kv,
    transfer as unknown as TransferEngine,
    {} as unknown as Device,
    kv.groups.map((g) => g.groupId),
    env,
    peers as unknown as PeerDirectory,
    mutationsFor(undefined),
    undefined,
  );
  // One work request per READ, no clipped tail: what is posted does not matter here, only when it lands.
  ctx.peerGeometry = () => ({ pageBytes: 0, numBlocks: 64, blockSizes: [16], tensorParallelSize: 1, numLayerSlabs: 1 });
  ctx.workRequestsFor = () => [{ ranges: [], footprint: [] }];
  ctx.clippedTails = () => [];
  return { reads: new ReadConsumer(ctx), released, land };
}

function recv(requestId: string, localBlockIds: number[][]): RecvReqMeta {
  return {
    requestId,
    transferId: `x-${requestId}`,
    localBlockIds,
    remoteBlockIds: localBlockIds,
    tokenRuns: [[0, 16 * (localBlockIds[0]?.length ?? 0)]],
    remoteBlockSize: 16,
    remoteEngineId: 'prefill-0',
    remoteHost: '127.0.0.1',
    remotePort: 1,
    grant: 'g',
  };
}

const flush = (): Promise<void> => new Promise((r) => setImmediate(r));

test("step N's settleLateReads while step N+1 awaits its READs leaves that step's landed READs alone", async () => {
  const { reads, released, land } = rig();
  // Step 2: a READ still in flight, then an empty one (decode's prefix cache holds its tokens).
  await reads.startLoadKv([recv('r1', [[3, 4]]), recv('r2', [[]])], 2);
  const step2 = reads.awaitReadsIssuedThisStep(2);
  await flush();
  // Step 1's forward is done meanwhile: its postForward runs (no READ of step 1 was left in flight).
  await reads.settleLateReads(1);
  land();
  const result = await step2;
  assert.deepEqual(result.failedReqIds, []);
  await flush();
  assert.deepEqual(released.sort(), ['x-r1', 'x-r2'], 'each READ released once, by the step that posted it');
  assert.equal(reads.numInFlight, 0);
});
