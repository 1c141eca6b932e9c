/**
 * Proves that a new data session for a peer at the same address does not kill the work requests in
 * flight to it. Every handshake hands out a new session token, and a refresh handshake with the same
 * producer happens whenever a request names another engine id at its address (peer_directory.ts): any
 * client can cause one per request with a made-up remote_engine_id. TcpPlane.setPeer dropped every
 * connection to the peer whenever the session changed, so each such request failed the other clients'
 * READs (and WRITEs) in flight to that producer with PEER_UNAVAILABLE. The old connections are
 * authenticated already (the peer keeps its last sessions per engine); only a new address drops them.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { until } from './receive_testkit.ts';
import { TcpPlane } from './nic_tcp.ts';
import { FrameDecoder, encodeDataHeader, encodeFrame, type ControlFrame } from './frame.ts';
import { packRanges } from '../core/ranges.ts';
import type { NicContext } from '../nic/nic_worker.ts';
import type { ErrorCode } from '../../util/errors.ts';

const PAGE = 4096;

test('a refreshed session to the same peer address leaves its READs in flight alone', async () => {
  const slabs = [new Uint8Array(new SharedArrayBuffer(4 * PAGE))];
  const completions: Array<{ wrId: number; code: ErrorCode | null }> = [];
  const ctx: NicContext = {
    engineId: 'D',
    layout: { numSlabs: 1, numBlocks: 4, pageBytes: PAGE },
    slabs,
    dataFrameBytes: 1 << 20,
    recvDirectMinBytes: 1 << 30,
    scatterRecv: false,
    lanes: 1,
    laneMinBytes: 1 << 30,
    sessionPeer: () => undefined,
    checkGrant: () => ({ ok: true }),
    complete: (wrId, code) => void completions.push({ wrId, code }),
    count: () => {},
    emit: () => {},
  };
  // The producer's data port: answers hello, holds the READ until the test answers it.
  const reads: Array<{ socket: net.Socket; reqId: number }> = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('error', () => {});
    const dec = new FrameDecoder({
      frame: (f: ControlFrame) => {
        if (f.type === 'hello') socket.write(encodeFrame({ type: 'helloOk' }));
        if (f.type === 'read') reads.push({ socket, reqId: f.reqId });
      },
      data: () => assert.fail('no DATA from a reader'),
    });
    socket.on('data', (d: Buffer) => dec.push(d));
  });
  const port = await new Promise<number>((r) =>
    server.listen(0, '127.0.0.1', () => r((server.address() as net.AddressInfo).port)),
  );
  const plane = new TcpPlane(ctx, '127.0.0.1', 0);
  try {
    plane.setPeer('P', { host: '127.0.0.1', port, session: 'aa'.repeat(16) });
    const ranges = packRanges([{ slab: 0, localOffset: PAGE, remoteOffset: 0, length: PAGE }]);
    plane.post({
      wrId: 7,
      slot: 0,
      kind: 'read',
      peerEngineId: 'P',
      transferId: 't',
      grantToken: 'ab'.repeat(16),
      ranges,
      delayMs: 0,
      failWith: null,
    });
    await until(() => reads.length === 1);
    // Another request's refresh handshake with the same producer: same address, new session.
    plane.setPeer('P', { host: '127.0.0.1', port, session: 'bb'.repeat(16) });
    await new Promise((r) => setTimeout(r, 100));
    const { socket, reqId } = reads[0] as { socket: net.Socket; reqId: number };
    socket.write(Buffer.concat([encodeDataHeader(reqId, 0, PAGE), Buffer.alloc(PAGE, 0x5a)]));
    await until(() => completions.length > 0, 3000);
    assert.deepEqual(completions, [{ wrId: 7, code: null }], 'the READ in flight completes');
    assert.ok((slabs[0] as Uint8Array).subarray(PAGE, 2 * PAGE).every((x) => x === 0x5a));
  } finally {
    await plane.close();
    for (const s of sockets) s.destroy();
    await new Promise((r) => server.close(r));
  }
});
