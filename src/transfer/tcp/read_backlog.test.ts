/**
 * Back-pressure on the serving side. A peer that sends READs (valid grant) but never reads the
 * replies makes the server queue every READ (each with its ranges) without bound: the Sender stops at
 * its high-water mark but the connection keeps decoding and queueing requests. WRITEs are capped
 * (WRITES_MAX); READs must be too: past the cap the connection is dropped.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { ServerConn } from './nic_tcp_conn.ts';
import { encodeFrame } from './frame.ts';
import type { NicContext } from '../nic/nic_worker.ts';
import { until } from './receive_testkit.ts';

const PAGE = 4096;
const SESSION = 'cd'.repeat(16);

test('a peer that never reads its READ replies cannot make the server queue READs without bound', async () => {
  const slabs = [new Uint8Array(new SharedArrayBuffer(1024 * PAGE))];
  const ctx: NicContext = {
    engineId: 'P',
    layout: { numSlabs: 1, numBlocks: 1024, pageBytes: PAGE },
    slabs,
    dataFrameBytes: 1 << 20,
    recvDirectMinBytes: 1 << 30,
    scatterRecv: false,
    lanes: 1,
    laneMinBytes: 1 << 30,
    sessionPeer: (s) => (s === SESSION ? 'D' : undefined),
    checkGrant: () => ({ ok: true }),
    complete: () => {},
    count: () => {},
    emit: () => {},
  };
  let conn: ServerConn | null = null;
  const server = net.createServer((s) => (conn = new ServerConn(s, ctx, () => {})));
  const port = await new Promise<number>((r) =>
    server.listen(0, '127.0.0.1', () => r((server.address() as net.AddressInfo).port)),
  );
  const client = net.connect(port, '127.0.0.1');
  client.on('error', () => {});
  client.pause(); // never reads a reply
  try {
    // Every READ asks for 8 pages (32 KiB): past the sender's high-water mark the replies queue up.
    const READ_BYTES = 8 * PAGE;
    const read = (reqId: number): Uint8Array =>
      encodeFrame({
        type: 'read',
        reqId,
        transferId: 't',
        grantToken: 'ab'.repeat(16),
        ranges: Float64Array.from([0, (reqId % 128) * READ_BYTES, READ_BYTES]),
      });
    const N = 8000;
    const frames: Uint8Array[] = [encodeFrame({ type: 'hello', engineId: 'D', session: SESSION })];
    for (let i = 1; i <= N; i++) frames.push(read(i));
    client.write(Buffer.concat(frames));
    const queued = (): number => (conn as unknown as { sender: { queue: unknown[] } } | null)?.sender.queue.length ?? 0;
    // Let the server take whatever it takes: until its queue stopped growing for 300 ms.
    for (let last = -1, stable = 0; stable < 3;) {
      await new Promise((r) => setTimeout(r, 100));
      const q = queued();
      stable = q === last ? stable + 1 : 0;
      last = q;
    }
    const c = conn as unknown as ServerConn;
    assert.ok(!c.socket.destroyed, 'the connection stays up');
    assert.ok(queued() <= 4096, `the server holds ${queued()} READs for a peer that reads nothing`);
    // Once the peer reads, every READ is answered.
    let got = 0;
    client.on('data', (d: Buffer) => (got += d.length));
    client.resume();
    await until(() => got >= N * (READ_BYTES + 17), 60_000);
  } finally {
    client.destroy();
    await new Promise((r) => server.close(r));
  }
});
