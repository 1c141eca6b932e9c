/**
 * An aborted READ stops being sent: the READs after it on the same connection do not wait for the rest of
 * its reply. Before, the client only dropped the rest of an aborted reply as it arrived, so every READ
 * queued behind a large aborted one waited for all of its bytes to cross the link (head-of-line). Now the
 * client tells the server (an error frame for the READ); the server drops what it had not yet handed to its
 * socket and answers REQUEST_ABORTED behind what it had.
 *
 * The link here is a relay (relay_testkit) that forwards server-to-client at 40 MiB/s with back-pressure (it
 * stops reading the server while 1 MiB waits in it), as a real slow link does: the server can only have handed
 * its socket up to SEND_HIGH_WATER (8 MiB) of a 47 MiB reply when the abort reaches it (the kernels'
 * socket buffers hold some MiB more).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { TcpPlane } from './nic_tcp.ts';
import { SEND_HIGH_WATER } from './tcp_sender.ts';
import type { WorkRequest } from '../nic/nic_messages.ts';
import type { ErrorCode } from '../../util/errors.ts';
import { PAGE, PEER_SESSION, planeContext, relay, sleep, workRequest } from './relay_testkit.ts';

/** 48 MiB slabs: more than the 8 MiB the server queues plus what the kernels' socket buffers hold. */
const BLOCKS = 48;

function context(engineId: string, done: Map<number, ErrorCode | null>): ReturnType<typeof planeContext> {
  const slabs = [new Uint8Array(new SharedArrayBuffer(PAGE * BLOCKS))];
  return planeContext(engineId, done, { slabs, layout: { numSlabs: 1, numBlocks: BLOCKS, pageBytes: PAGE } });
}

const read = (wrId: number, first: number, pages: number): WorkRequest => workRequest(wrId, 'read', pages, first);

test('tcp: an aborted READ stops being sent; the READ behind it lands without waiting for the rest of its reply', async () => {
  const done = new Map<number, ErrorCode | null>();
  const serverCtx = context('P', new Map());
  (serverCtx.slabs[0] as Uint8Array).fill(0x5a);
  const server = new TcpPlane(serverCtx, '127.0.0.1', 0);
  const port = await server.listen();
  const forwarded = { bytes: 0 };
  const link = await relay(port, { dir: 'down', bytesPer50Ms: 2 << 20, holdMax: 1 << 20, forwarded });
  const clientCtx = context('D', done);
  const client = new TcpPlane(clientCtx, '127.0.0.1', 0);
  await client.listen();
  const relayPort = (link.address() as net.AddressInfo).port;
  client.setPeer('P', { host: '127.0.0.1', port: relayPort, session: PEER_SESSION });
  try {
    const big = BLOCKS - 1; // 47 MiB
    client.post(read(1, 0, big));
    await sleep(20); // its reply is under way, held back by the link
    let acked = false;
    client.abort(1, () => (acked = true));
    client.post(read(2, big, 1));
    for (let i = 0; i < 500 && !done.has(2); i++) await sleep(20);
    assert.equal(done.get(2), null, `the READ behind the aborted one: ${String(done.get(2))}`);
    assert.ok(acked, 'the abort was acknowledged');
    const page = (clientCtx.slabs[0] as Uint8Array).subarray(big * PAGE, (big + 1) * PAGE);
    assert.ok(
      page.every((b) => b === 0x5a),
      'READ 2 landed',
    );
    // What crossed the link before READ 2 landed: what the server had handed its socket of READ 1 (at
    // most SEND_HIGH_WATER and a frame), plus READ 2. Without the cancel: all 47 MiB of READ 1 first.
    const moved = forwarded.bytes;
    assert.ok(moved < big * PAGE, `${moved} bytes crossed before READ 2 landed: READ 1 was sent whole`);
    assert.ok(moved <= SEND_HIGH_WATER + 24 * PAGE, `${moved} bytes crossed`);
    // The connection keeps carrying work.
    client.post(read(3, 0, 1));
    for (let i = 0; i < 500 && !done.has(3); i++) await sleep(20);
    assert.equal(done.get(3), null, 'the next READ did not complete');
  } finally {
    await Promise.all([client.close(), server.close()]);
    link.close();
  }
});
