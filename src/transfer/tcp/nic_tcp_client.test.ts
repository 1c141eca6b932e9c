/**
 * Proves the READ receive path of a tcp data connection (nic_tcp_client.ts) against a scripted peer:
 * whatever the page mapping, frame size, chunking and direct-receive threshold, every byte lands at its
 * destination, nothing else changes, and the READ completes exactly once; segments at or above the
 * threshold are read in place (never copied in JS), shorter ones never are; with scatter receive (readv
 * through the native addon) every byte is read in place, and a DATA frame that does not continue its READ
 * lands no byte. Aborting a READ whose slab
 * view is armed acknowledges only after the next read replaced the view, and no byte lands after the
 * acknowledgement; when the peer goes silent instead, the connection is dropped and the abort acknowledged.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import fc from 'fast-check';
import { assertLanded, shuffledPages, until } from './receive_testkit.ts';
import { ClientConn } from './nic_tcp_client.ts';
import { FrameDecoder, encodeDataHeader, encodeFrame, type ControlFrame } from './frame.ts';
import { packRanges, coalescePacked } from '../core/ranges.ts';
import type { NicContext } from '../nic/nic_worker.ts';
import type { WorkRequest } from '../nic/nic_messages.ts';
import type { TransferRange } from '../core/types.ts';
import type { ErrorCode } from '../../util/errors.ts';
import { scatterNative } from './scatter_native.ts';

/** Scatter receive is tested whenever the addon is built (scatter_native.test.ts fails when it is not). */
const SCATTER_CASES = scatterNative() === null ? [false] : [false, true];

const PAGE = 4096;
const SENTINEL = 0xee;

interface Fake {
  ctx: NicContext;
  completions: Array<{ wrId: number; code: ErrorCode | null }>;
}

function fakeCtx(slabs: Uint8Array[], recvDirectMinBytes: number, scatterRecv = false): Fake {
  const completions: Fake['completions'] = [];
  const ctx: NicContext = {
    engineId: 'D',
    layout: { numSlabs: slabs.length, numBlocks: (slabs[0] as Uint8Array).length / PAGE, pageBytes: PAGE },
    slabs,
    dataFrameBytes: 1 << 20,
    recvDirectMinBytes,
    scatterRecv,
    lanes: 1,
    laneMinBytes: 1 << 30,
    sessionPeer: () => undefined,
    checkGrant: () => ({ ok: true }),
    complete: (wrId, code) => void completions.push({ wrId, code }),
    count: () => {},
    emit: () => {},
  };
  return { ctx, completions };
}

/** A data port that answers the hello and hands every READ frame to `onRead` with its socket. */
async function scriptedPeer(
  onRead: (socket: net.Socket, f: Extract<ControlFrame, { ranges: Float64Array }>) => void,
): Promise<{ port: number; close: () => Promise<void> }> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('error', () => {});
    const dec = new FrameDecoder({
      frame: (f) => {
        if (f.type === 'hello') socket.write(encodeFrame({ type: 'helloOk' }));
        if (f.type === 'read') onRead(socket, f);
      },
      data: () => assert.fail('a client sends no DATA for a READ'),
    });
    socket.on('data', (d: Buffer) => dec.push(d));
  });
  const port = await new Promise<number>((resolve) =>
    server.listen(0, '127.0.0.1', () => resolve((server.address() as net.AddressInfo).port)),
  );
  const close = (): Promise<void> => {
    for (const s of sockets) s.destroy();
    return new Promise((resolve) => server.close(() => resolve()));
  };
  return { port, close };
}

function workRequest(wrId: number, ranges: TransferRange[]): WorkRequest {
  return {
    wrId,
    slot: 0,
    kind: 'read',
    peerEngineId: 'P',
    transferId: 't',
    grantToken: 'ab'.repeat(16),
    ranges: coalescePacked(packRanges(ranges)),
    delayMs: 0,
    failWith: null,
  };
}

/** The bytes of a READ frame's ranges, in stream order, from the producer's `source` slabs. */
function streamOf(f: Extract<ControlFrame, { ranges: Float64Array }>, source: Uint8Array[]): Uint8Array {
  const parts: Uint8Array[] = [];
  for (let j = 0; j < f.ranges.length; j += 3) {
    const [slab, offset, length] = [f.ranges[j] as number, f.ranges[j + 1] as number, f.ranges[j + 2] as number];
    parts.push((source[slab] as Uint8Array).subarray(offset, offset + length));
  }
  return Buffer.concat(parts);
}

const mapping = shuffledPages(PAGE, 24, 8, 'local');

test('READ receive: any mapping, frame size, chunking and threshold lands every byte once; big segments in place', async () => {
  const source = [0, 1].map((s) =>
    Uint8Array.from({ length: 26 * PAGE }, (_, i) => (i * 7 + s * 13 + (i >> 12)) & 0xff),
  );
  await fc.assert(
    fc.asyncProperty(
      mapping,
      fc.constantFrom(1, PAGE, 2 * PAGE, 1 << 30),
      fc.integer({ min: 1000, max: 40_000 }),
      fc.array(fc.integer({ min: 1, max: 9000 }), { minLength: 1, maxLength: 8 }),
      fc.constantFrom(...SCATTER_CASES),
      async (ranges, threshold, frameBytes, cuts, scatter) => {
        const slabs = [0, 1].map(() => new Uint8Array(new SharedArrayBuffer(26 * PAGE)).fill(SENTINEL));
        const { ctx, completions } = fakeCtx(slabs, threshold, scatter);
        const peer = await scriptedPeer((socket, f) => {
          const bytes = streamOf(f, source);
          const wire: Uint8Array[] = [];
          for (let at = 0; at < bytes.length; at += frameBytes) {
            const n = Math.min(frameBytes, bytes.length - at);
            wire.push(encodeDataHeader(f.reqId, at, n), bytes.subarray(at, at + n));
          }
          const all = Buffer.concat(wire);
          // Written in pieces with a pause between: the client sees many reads of every size.
          let at = 0;
          const next = (k: number): void => {
            if (at >= all.length || socket.destroyed) return;
            // The first 200 writes are cut as drawn, the rest goes at once (bounded time under load).
            const n = k < 200 ? (cuts[k % cuts.length] as number) : all.length - at;
            socket.write(all.subarray(at, at + n));
            at += n;
            setImmediate(() => next(k + 1));
          };
          next(0);
        });
        const conn = ClientConn.connect(
          ctx,
          'P',
          { host: '127.0.0.1', port: peer.port, session: 'ab'.repeat(16) },
          () => {},
        );
        try {
          conn.post(workRequest(7, ranges));
          await until(() => completions.length > 0, 30_000);
          assert.deepEqual(completions, [{ wrId: 7, code: null }]);
          assertLanded(slabs, source, ranges, 'local', SENTINEL);
          const total = ranges.length * PAGE;
          if (threshold === 1 || scatter) assert.equal(conn.bytesInPlace, total, 'every byte read in place');
          else if (threshold === 1 << 30) assert.equal(conn.bytesInPlace, 0, 'no segment reaches the threshold');
          assert.ok(conn.bytesInPlace <= total);
        } finally {
          conn.destroy('PEER_UNAVAILABLE', 'test over');
          await peer.close();
        }
      },
    ),
    { numRuns: 40 },
  );
});

/** One 512 KiB READ into an empty 1 MiB slab, every byte received direct; the peer sends what the test says. */
async function armedRead(scatter = false): Promise<{
  conn: ClientConn;
  slab: Uint8Array;
  completions: Fake['completions'];
  send: (from: number, to: number) => void;
  close: () => Promise<void>;
}> {
  const slab = new Uint8Array(new SharedArrayBuffer(256 * PAGE)).fill(SENTINEL);
  const { ctx, completions } = fakeCtx([slab], 1, scatter);
  const payload = Uint8Array.from({ length: 128 * PAGE }, (_, i) => (i % 251) + 1);
  let socket: net.Socket | null = null;
  const peer = await scriptedPeer((s, f) => {
    if (f.reqId !== 1) return; // later READs stay unanswered
    socket = s;
    s.write(encodeDataHeader(f.reqId, 0, payload.length));
  });
  const conn = ClientConn.connect(ctx, 'P', { host: '127.0.0.1', port: peer.port, session: 'ab'.repeat(16) }, () => {});
  conn.post(workRequest(1, [{ slab: 0, remoteOffset: 0, localOffset: 0, length: payload.length }]));
  await until(() => socket !== null);
  const send = (from: number, to: number): void => void socket?.write(payload.subarray(from, to));
  return { conn, slab, completions, send, close: peer.close };
}

for (const scatter of SCATTER_CASES)
  test(`READ receive${scatter ? ' (scatter)' : ''}: aborting a READ with an armed view acks after the next read; nothing lands after`, async () => {
    const { conn, slab, completions, send, close } = await armedRead(scatter);
    try {
      send(0, 16 * PAGE);
      await until(() => conn.bytesInPlace === 16 * PAGE);
      assert.equal(conn.abort(1), 'armed', 'the rest of the payload is aimed at the pages');
      let acked = false;
      conn.whenDisarmed(() => (acked = true));
      assert.equal(acked, false, 'not acknowledged while the view is armed');
      send(16 * PAGE, 32 * PAGE);
      await until(() => acked);
      const landed = slab.slice();
      send(32 * PAGE, 128 * PAGE);
      await new Promise((r) => setTimeout(r, 100));
      assert.deepEqual(slab, landed, 'no byte lands after the acknowledgement');
      assert.ok(
        slab.subarray(32 * PAGE).every((x) => x === SENTINEL),
        'the rest of the READ never landed',
      );
      assert.deepEqual(completions, [], 'an aborted READ is completed by the NIC, not by the connection');
    } finally {
      conn.destroy('PEER_UNAVAILABLE', 'test over');
      await close();
    }
  });

test('READ receive: aborting an armed READ on a silent peer drops the connection and acknowledges', async () => {
  const { conn, completions, send, close } = await armedRead();
  try {
    send(0, 16 * PAGE);
    await until(() => conn.bytesInPlace === 16 * PAGE);
    conn.post(workRequest(2, [{ slab: 0, remoteOffset: 0, localOffset: 200 * PAGE, length: PAGE }]));
    assert.equal(conn.abort(1), 'armed');
    const t0 = Date.now();
    let acked = false;
    conn.whenDisarmed(() => (acked = true));
    await until(() => acked);
    assert.ok(Date.now() - t0 < 2000, 'acknowledged soon after the peer went silent');
    await until(() => completions.length > 0);
    assert.deepEqual(completions, [{ wrId: 2, code: 'PEER_UNAVAILABLE' }], 'the READ behind it fails, typed');
  } finally {
    conn.destroy('PEER_UNAVAILABLE', 'test over');
    await close();
  }
});

for (const scatter of SCATTER_CASES)
  test(`READ receive${scatter ? ' (scatter)' : ''}: a DATA frame that does not continue its READ lands no byte`, async () => {
    const slab = new Uint8Array(new SharedArrayBuffer(64 * PAGE)).fill(SENTINEL);
    // Threshold 1: without the check, the payload would be read straight into the READ's pages.
    const { ctx, completions } = fakeCtx([slab], 1, scatter);
    const payload = new Uint8Array(8 * PAGE).fill(7);
    const peer = await scriptedPeer((s, f) => {
      // Out of order (starts one page in), then beyond the READ's end: both are refused unread.
      const offset = f.reqId === 1 ? PAGE : 0;
      const length = f.reqId === 1 ? payload.length - PAGE : payload.length + PAGE;
      s.write(Buffer.concat([encodeDataHeader(f.reqId, offset, length), new Uint8Array(length).fill(7)]));
    });
    try {
      for (const wrId of [1, 2]) {
        const conn = ClientConn.connect(
          ctx,
          'P',
          { host: '127.0.0.1', port: peer.port, session: 'ab'.repeat(16) },
          () => {},
        );
        conn.post(workRequest(wrId, [{ slab: 0, remoteOffset: 0, localOffset: 0, length: payload.length }]));
        await until(() => completions.some((c) => c.wrId === wrId));
        assert.deepEqual(
          completions.find((c) => c.wrId === wrId),
          { wrId, code: 'TRANSFER_FAILED' },
        );
        assert.equal(conn.bytesInPlace, 0);
        assert.ok(
          slab.every((b) => b === SENTINEL),
          'no byte of the bad frame reached the pages',
        );
      }
    } finally {
      await peer.close();
    }
  });
