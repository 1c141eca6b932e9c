/**
 * Prefill in WRITE mode: a `release` that arrives while the push from a request's pages is under way
 * does not report the request (its pages would be freed, and maybe reused, while the NIC still reads
 * them for the WRITE); the push's end reports it, once. (In WRITE mode prefill issues no grant, so the
 * release cannot be checked against one: any decode request naming the transfer that is refused before
 * allocation sends it.) Driven through the real OneSidedConnectorWorker (its notification routing,
 * Producer, WriteProducer) over a recording transfer engine whose WRITE ends when the test says.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../util/env.ts';
import type { Device } from '../device/types.ts';
import { presetKVGroups } from '../kv/presets.ts';
import { makeKVCacheConfig } from '../kv/spec.ts';
import type { TransferEngine, Notification } from '../transfer/core/types.ts';
import { DEFAULT_ONE_SIDED_CONFIG } from './config.ts';
import type { PeerDirectory } from './peer_directory.ts';
import { OneSidedConnectorWorker } from './one_sided_worker.ts';
import { emptyOneSidedMetadata } from '../worker/connector_metadata.ts';
import { makeEmptySchedulerOutput } from '../worker/scheduler_output.ts';

test("WRITE producer: a release during the push does not report the pages; the push's end does, once", async () => {
  const env = new SimEnv(1);
  const kv = makeKVCacheConfig(presetKVGroups('llama-mini', 16), 64);
  let handler: ((from: string, n: Notification) => void) | null = null;
  let finishWrite: (() => void) | null = null;
  const posted: string[] = [];
  const transfer = {
    onNotification: (h: (from: string, n: Notification) => void) => ((handler = h), () => undefined),
    issueGrant: () => ({ token: 'ab'.repeat(16), expiresAtMs: 1e9 }),
    revokeGrant: () => true,
    drainGrant: () => Promise.resolve(),
    notify: () => Promise.resolve(),
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
    postWrite: (w: { transferId: string }) => (posted.push(w.transferId), { id: 1 }),
    wait: () => new Promise<void>((resolve) => (finishWrite = resolve)),
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
  // Step 1: request R finished, its pages [1,2,3] are held and final (save); the scheduler names them held.
  const so1 = step(1, (m) => {
    m.sendTransfers = { T: 'R' };
    m.reqsToSave = [{ requestId: 'R', transferId: 'T', localBlockIds: [[1, 2, 3]] }];
  });
  await worker.preForward(so1);
  // Decode says where to write: the push starts.
  handler!('decode-0', {
    type: 'remote_blocks',
    transferId: 'T',
    payload: { blockIds: [[7, 8, 9]], skipBlocks: 0, endToken: 40, grant: 'cd'.repeat(16) },
  });
  worker.saves.startReadySaves();
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(posted, ['T'], 'the WRITE from pages 1..3 is in flight');
  assert.notEqual(finishWrite, null, 'and not finished');
  // A release for T arrives (WRITE mode: prefill has no grant for T, so nothing checks it).
  handler!('decode-0', { type: 'release', transferId: 'T', payload: { grant: '' } });
  const out1 = await worker.postForward(so1);
  assert.deepEqual(
    out1.finishedSending,
    [],
    `R reported free (its pages go back to the pool) while the WRITE still reads them: ${JSON.stringify(out1.finishedSending)}`,
  );
  finishWrite!();
  await new Promise((r) => setImmediate(r));
  const so2 = step(2, (m) => (m.sendTransfers = { T: 'R' }));
  await worker.preForward(so2);
  const out2 = await worker.postForward(so2);
  assert.deepEqual(out2.finishedSending, ['R'], 'reported when the push ended');
  const so3 = step(3, () => undefined);
  await worker.preForward(so3);
  assert.deepEqual((await worker.postForward(so3)).finishedSending, [], 'and only once');
});
