/**
 * The laned-denial case of laned_denied.test.ts over a slow link (300 ms one way, e.g. between
 * regions): a laned READ refused by the grant must not fail the valid READ riding its lanes.
 *
 * When one part of a laned READ fails, the plane aborts its other parts. Those parts were posted with the
 * failed one, so their own answers are still on the wire; ClientConn.abort took that silence (nothing
 * arrived since a READ posted STILL_MS or more ago) for a stalled link and dropped the connection with
 * every other READ on it: the valid READ failed with PEER_UNAVAILABLE ("no data from P since READ 1 was
 * posted: connection dropped"). The sibling parts' abort now never infers a stall.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { TcpPlane } from './nic_tcp.ts';
import { packRanges } from '../core/ranges.ts';
import type { NicContext } from '../nic/nic_worker.ts';
import type { WorkRequest } from '../nic/nic_messages.ts';
import type { ErrorCode } from '../../util/errors.ts';

const PAGE = 1 << 16;
const BLOCKS = 64;
const SESSION = 'a'.repeat(32);
const DELAY_MS = 300;

function ctx(engineId: string, completions: Map<number, ErrorCode | null>, fill: number): NicContext {
  const slabs = [new Uint8Array(new SharedArrayBuffer(PAGE * BLOCKS)).fill(fill)];
  return {
    engineId,
    layout: { numSlabs: 1, numBlocks: BLOCKS, pageBytes: PAGE },
    slabs,
    dataFrameBytes: 1 << 16,
    recvDirectMinBytes: 1 << 12,
    scatterRecv: false,
    lanes: 2,
    laneMinBytes: 2 * PAGE,
    sessionPeer: (s) => (s === SESSION ? 'D' : undefined),
    checkGrant: (_peer, transferId) => (transferId === 'bad' ? { ok: false, reason: 'not granted' } : { ok: true }),
    complete: (wrId, code) => void completions.set(wrId, code),
    count: () => {},
    emit: () => {},
  } as NicContext;
}

/** A relay to `target` that delays every byte from the server by DELAY_MS (a long link, in order). */
async function slowRelay(target: number): Promise<net.Server> {
  const server = net.createServer((client) => {
    const upstream = net.connect({ host: '127.0.0.1', port: target });
    client.on('data', (d: Buffer) => upstream.write(d));
    upstream.on('data', (d: Buffer) => void setTimeout(() => client.destroyed || client.write(d), DELAY_MS));
    for (const s of [client, upstream]) s.on('error', () => {});
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => setTimeout(() => client.destroy(), DELAY_MS + 10));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return server;
}

function read(wrId: number, transferId: string, local: number, pages: number): WorkRequest {
  return {
    wrId,
    slot: 0,
    kind: 'read',
    peerEngineId: 'P',
    transferId,
    grantToken: 'b'.repeat(32),
    ranges: packRanges([{ slab: 0, localOffset: local * PAGE, remoteOffset: local * PAGE, length: pages * PAGE }]),
    delayMs: 0,
    failWith: null,
  } as WorkRequest;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

test('tcp lanes over a slow link: a READ refused by the grant leaves the valid READ on its lanes intact', async () => {
  const done = new Map<number, ErrorCode | null>();
  const server = new TcpPlane(ctx('P', new Map(), 0x5a), '127.0.0.1', 0);
  const port = await server.listen();
  const clientCtx = ctx('D', done, 0);
  const client = new TcpPlane(clientCtx, '127.0.0.1', 0);
  await client.listen();
  const relay = await slowRelay(port);
  client.setPeer('P', { host: '127.0.0.1', port: (relay.address() as net.AddressInfo).port, session: SESSION });
  try {
    // Both lanes open and warm.
    client.post(read(9, 'good', 0, 2));
    for (let i = 0; i < 250 && !done.has(9); i++) await sleep(20);
    assert.equal(done.get(9), null, 'the warm-up READ did not complete');
    client.post(read(1, 'bad', 2, 4));
    client.post(read(2, 'good', 8, 32));
    for (let i = 0; i < 250 && !(done.has(1) && done.has(2)); i++) await sleep(20);
    assert.equal(done.get(1), 'GRANT_DENIED');
    assert.equal(done.get(2), null, `the valid READ beside the refused one failed: ${String(done.get(2))}`);
    assert.ok((clientCtx.slabs[0] as Uint8Array).subarray(8 * PAGE, 40 * PAGE).every((b) => b === 0x5a));
  } finally {
    relay.close();
    await Promise.all([client.close(), server.close()]);
  }
});
