/**
 * Proves the WRITE receive path of a tcp data connection (ServerConn, nic_tcp_conn.ts) against a scripted
 * writer: whatever the page mapping, frame size and chunking, every byte lands at its destination once,
 * nothing else changes and `done` is answered exactly once; with scatter receive the payload that was
 * still in the kernel after a read is taken by readv straight into the pages, and a DATA frame that does
 * not continue its WRITE lands no byte.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import fc from 'fast-check';
import { assertLanded, shuffledPages, until } from './receive_testkit.ts';
import { ServerConn } from './nic_tcp_conn.ts';
import { FrameDecoder, encodeDataHeader, encodeFrame, type ControlFrame } from './frame.ts';
import { packRanges, sideOf, toWire } from '../core/ranges.ts';
import type { NicContext } from '../nic/nic_worker.ts';
import { scatterNative } from './scatter_native.ts';

const PAGE = 4096;
const SENTINEL = 0xee;
const SESSION = 'cd'.repeat(16);
const SCATTER_CASES = scatterNative() === null ? [false] : [false, true];

function ctxFor(slabs: Uint8Array[], scatterRecv: boolean): NicContext {
  return {
    engineId: 'D',
    layout: { numSlabs: slabs.length, numBlocks: (slabs[0] as Uint8Array).length / PAGE, pageBytes: PAGE },
    slabs,
    dataFrameBytes: 1 << 20,
    recvDirectMinBytes: 1 << 30,
    scatterRecv,
    lanes: 1,
    laneMinBytes: 1 << 30,
    sessionPeer: (s) => (s === SESSION ? 'P' : undefined),
    checkGrant: () => ({ ok: true }),
    complete: () => {},
    count: () => {},
    emit: () => {},
  };
}

/** A ServerConn on a fresh port; `writer` is the producer's socket, its frames decoded into `frames`. */
async function serverPair(ctx: NicContext): Promise<{
  conn: () => ServerConn | null;
  writer: net.Socket;
  frames: ControlFrame[];
  close: () => Promise<void>;
}> {
  let conn: ServerConn | null = null;
  const server = net.createServer((s) => (conn = new ServerConn(s, ctx, () => {})));
  const port = await new Promise<number>((r) =>
    server.listen(0, '127.0.0.1', () => r((server.address() as net.AddressInfo).port)),
  );
  const writer = net.connect(port, '127.0.0.1');
  writer.on('error', () => {});
  const frames: ControlFrame[] = [];
  const dec = new FrameDecoder({ frame: (f) => void frames.push(f), data: () => assert.fail('no DATA to a writer') });
  writer.on('data', (d: Buffer) => dec.push(d));
  writer.write(encodeFrame({ type: 'hello', engineId: 'P', session: SESSION }));
  return {
    conn: () => conn,
    writer,
    frames,
    close: async () => {
      writer.destroy();
      await new Promise((r) => server.close(r));
    },
  };
}

const mapping = shuffledPages(PAGE, 40, 4, 'remote');

test('WRITE receive: any mapping, frame size and chunking lands every byte once and answers done once', async () => {
  await fc.assert(
    fc.asyncProperty(
      mapping,
      fc.integer({ min: 1000, max: 70_000 }),
      fc.array(fc.integer({ min: 1, max: 90_000 }), { minLength: 1, maxLength: 6 }),
      fc.constantFrom(...SCATTER_CASES),
      async (ranges, frameBytes, cuts, scatter) => {
        const slabs = [0, 1].map(() => new Uint8Array(new SharedArrayBuffer(48 * PAGE)).fill(SENTINEL));
        const source = [0, 1].map((s) =>
          Uint8Array.from({ length: 48 * PAGE }, (_, i) => (i * 5 + s * 17 + (i >> 12)) & 0xff),
        );
        const pair = await serverPair(ctxFor(slabs, scatter));
        try {
          // The stream, in the order of the ranges as posted (the remote side is ours).
          const packed = packRanges(ranges);
          const bytes = Buffer.concat(
            ranges.map((r) => (source[r.slab] as Uint8Array).subarray(r.localOffset, r.localOffset + r.length)),
          );
          const wire: Uint8Array[] = [
            encodeFrame({
              type: 'write',
              reqId: 5,
              transferId: 't',
              grantToken: 'ab'.repeat(16),
              ranges: toWire(sideOf(packed, 'remote')),
            }),
          ];
          for (let at = 0; at < bytes.length; at += frameBytes) {
            const n = Math.min(frameBytes, bytes.length - at);
            wire.push(encodeDataHeader(5, at, n), bytes.subarray(at, at + n));
          }
          const all = Buffer.concat(wire);
          // In pieces with pauses: the server sees reads of every size, and payload left in the kernel.
          let at = 0;
          for (let k = 0; at < all.length; k++) {
            const n = k < 100 ? (cuts[k % cuts.length] as number) : all.length - at;
            pair.writer.write(all.subarray(at, at + n));
            at += n;
            await new Promise((r) => setImmediate(r));
          }
          await until(() => pair.frames.length === 2);
          await new Promise((r) => setTimeout(r, 5));
          assert.deepEqual(pair.frames, [{ type: 'helloOk' }, { type: 'done', reqId: 5 }], 'done, once');
          assertLanded(slabs, source, ranges, 'remote', SENTINEL);
          const conn = pair.conn() as ServerConn;
          if (!scatter) assert.equal(conn.bytesInPlace, 0);
          assert.ok(conn.bytesInPlace <= bytes.length);
        } finally {
          await pair.close();
        }
      },
    ),
    { numRuns: 30 },
  );
});

for (const scatter of SCATTER_CASES)
  test(`WRITE receive${scatter ? ' (scatter)' : ''}: a big WRITE sent at once is read in place by readv; a bad frame lands no byte`, async () => {
    const slabs = [new Uint8Array(new SharedArrayBuffer(600 * PAGE)).fill(SENTINEL)];
    const pair = await serverPair(ctxFor(slabs, scatter));
    try {
      // 512 scattered pages (every other page), 2 MiB in one DATA frame.
      const ranges = Array.from({ length: 256 }, (_, i) => ({
        slab: 0,
        localOffset: 0,
        remoteOffset: 2 * i * PAGE,
        length: PAGE,
      }));
      const bytes = Uint8Array.from({ length: 256 * PAGE }, (_, i) => (i % 253) + 1);
      const write = encodeFrame({
        type: 'write',
        reqId: 1,
        transferId: 't',
        grantToken: 'ab'.repeat(16),
        ranges: toWire(sideOf(packRanges(ranges), 'remote')),
      });
      pair.writer.write(Buffer.concat([write, encodeDataHeader(1, 0, bytes.length), bytes]));
      await until(() => pair.frames.length === 2);
      assert.deepEqual(pair.frames[1], { type: 'done', reqId: 1 });
      ranges.forEach((r, i) =>
        assert.deepEqual(
          slabs[0]?.subarray(r.remoteOffset, r.remoteOffset + PAGE),
          bytes.subarray(i * PAGE, (i + 1) * PAGE),
        ),
      );
      const conn = pair.conn() as ServerConn;
      if (scatter)
        assert.ok(conn.bytesInPlace > 0 && conn.scatterReads > 0, 'some of the payload went straight into the pages');
      // A second WRITE whose DATA starts one page in: refused before any byte lands.
      const before = (slabs[0] as Uint8Array).slice();
      const w2 = encodeFrame({
        type: 'write',
        reqId: 2,
        transferId: 't',
        grantToken: 'ab'.repeat(16),
        ranges: toWire(
          sideOf(packRanges(ranges.map((r) => ({ ...r, remoteOffset: r.remoteOffset + PAGE }))), 'remote'),
        ),
      });
      pair.writer.write(Buffer.concat([w2, encodeDataHeader(2, PAGE, bytes.length - PAGE), bytes.subarray(PAGE)]));
      await until(() => pair.writer.destroyed || pair.writer.readableEnded || (pair.conn()?.socket.destroyed ?? false));
      assert.deepEqual(slabs[0], before, 'no byte of the out-of-order WRITE landed');
    } finally {
      await pair.close();
    }
  });
