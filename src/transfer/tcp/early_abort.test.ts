/**
 * Aborting one READ soon after it was posted must not fail the other READs in flight to the same peer.
 *
 * ClientConn.abort takes a READ on which no byte arrived since its post for a stalled link (TCP in
 * backoff after a cut) and the plane drops the whole connection. That inference holds for a READ aborted at
 * its timeout; one aborted before its first reply could arrive (within a round trip of its post: a step's
 * other work request refused at post, the engine closing, a caller cancelling) proved nothing, yet every
 * other READ on that connection failed with PEER_UNAVAILABLE ("no data from P since READ 2 was posted:
 * connection dropped"). Before the fix READ 1 here failed so; the engine-level version (abort a READ 5 ms
 * after posting it, four READs queued beside it) failed the same way on loopback.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { TcpPlane } from './nic_tcp.ts';
import { packRanges } from '../core/ranges.ts';
import type { NicContext } from '../nic/nic_worker.ts';
import type { WorkRequest } from '../nic/nic_messages.ts';
import type { ErrorCode } from '../../util/errors.ts';
import { PAGE, PEER_SESSION, planeContext } from './relay_testkit.ts';

function ctx(engineId: string, completions: Map<number, ErrorCode | null>, fill: number): NicContext {
  const c = planeContext(engineId, completions);
  (c.slabs[0] as Uint8Array).fill(fill);
  return c;
}

function read(wrId: number, local: number, pages: number): WorkRequest {
  return {
    wrId,
    slot: 0,
    kind: 'read',
    peerEngineId: 'P',
    transferId: 't',
    grantToken: 'b'.repeat(32),
    ranges: packRanges([{ slab: 0, localOffset: local * PAGE, remoteOffset: 0, length: pages * PAGE }]),
    delayMs: 0,
    failWith: null,
  } as WorkRequest;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

test('tcp: a READ aborted right after its post leaves the READs beside it on the connection intact', async () => {
  const done = new Map<number, ErrorCode | null>();
  const serverCtx = ctx('P', new Map(), 0x5a);
  const server = new TcpPlane(serverCtx, '127.0.0.1', 0);
  const port = await server.listen();
  const clientCtx = ctx('D', done, 0);
  const client = new TcpPlane(clientCtx, '127.0.0.1', 0);
  await client.listen();
  client.setPeer('P', { host: '127.0.0.1', port, session: PEER_SESSION });
  try {
    // A warm connection, as between engines that already moved data.
    client.post(read(9, 15, 1));
    for (let i = 0; i < 250 && !done.has(9); i++) await sleep(20);
    assert.equal(done.get(9), null, 'the first READ did not complete');
    client.post(read(1, 0, 8));
    client.post(read(2, 8, 4));
    let acked = false;
    client.abort(2, () => (acked = true)); // before any reply to either could arrive
    for (let i = 0; i < 250 && !done.has(1); i++) await sleep(20);
    assert.equal(done.get(1), null, `the READ beside the aborted one failed: ${String(done.get(1))}`);
    assert.ok(acked, 'the abort was acknowledged');
    assert.ok(
      (clientCtx.slabs[0] as Uint8Array).subarray(0, 8 * PAGE).every((b) => b === 0x5a),
      'READ 1 landed',
    );
    // The connection keeps carrying work.
    client.post(read(3, 12, 1));
    for (let i = 0; i < 250 && !done.has(3); i++) await sleep(20);
    assert.equal(done.get(3), null, 'the next READ did not complete');
  } finally {
    await Promise.all([client.close(), server.close()]);
  }
});
