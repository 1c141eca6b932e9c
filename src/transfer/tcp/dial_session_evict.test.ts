/**
 * Proves dials that fail cannot push a real peer's data sessions out of our NIC. The NIC keeps the newest
 * 4 sessions per engine id (nic_worker.ts addSession), and the dialer registered the session of its hello
 * under whatever engine id the listener's challenge claimed, before the listener answered. A listener that
 * claims a real peer's id (any client can make us dial an address of its choosing) and then refuses took
 * one of that peer's slots per dial in progress: after 4 such dials at once the peer's own session was
 * gone, and its next data connection to us (here: its WRITE into our granted pages) was refused ("unknown
 * data session"). Dial sessions now count against no slot until the welcome passed.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { isHandoffError } from '../../util/errors.ts';
import { makeNode, pageRanges, readOf } from '../testing/conformance.ts';
import { FrameDecoder, encodeFrame, type ControlFrame } from './frame.ts';

/**
 * A side-channel listener that challenges as `engineId` and refuses the hellos once `n` came (every dial is
 * then in its handshake: its session registered before its hello left).
 */
async function refuser(engineId: string, n: number): Promise<{ port: number; close: () => void }> {
  const sockets: net.Socket[] = [];
  const waiting: net.Socket[] = [];
  const refuse = { m: 'refuse', code: 'PEER_INCOMPATIBLE', message: 'no' };
  const server = net.createServer((s) => {
    sockets.push(s);
    s.on('error', () => {});
    const dec = new FrameDecoder({
      frame: (f: ControlFrame) => {
        if (f.type !== 'side' || (f.body as { m: string }).m !== 'hello') return;
        waiting.push(s);
        if (waiting.length < n) return;
        for (const w of waiting.splice(0)) w.write(encodeFrame({ type: 'side', body: refuse }));
      },
      data: () => {},
    });
    s.on('data', (d: Buffer) => dec.push(d));
    s.write(encodeFrame({ type: 'side', body: { m: 'challenge', nonce: 'ab'.repeat(16), engineId } }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  return {
    port: (server.address() as net.AddressInfo).port,
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

test("failed dials to a listener claiming a peer's engine id leave that peer's data session alone", async () => {
  const [P, D] = await Promise.all([
    makeNode('tcp', 41, { engineId: 'evictP', lanes: 1 }),
    makeNode('tcp', null, { engineId: 'evictD', lanes: 1 }),
  ]);
  const fake = await refuser(P.engine.engineId, 4);
  try {
    await D.engine.handshake(P.engine.address()); // P may now connect to D's data port with D's session
    // Four dials at once (each in its handshake when the next starts): a session each, under P's id.
    const dials = Array.from({ length: 4 }, () => D.engine.handshake({ host: '127.0.0.1', port: fake.port }));
    for (const d of dials) await assert.rejects(d, (e: unknown) => isHandoffError(e) && e.code === 'PEER_INCOMPATIBLE');
    const g = D.engine.issueGrant({ transferId: 'w', peerEngineId: P.engine.engineId, blockIds: [3], ttlMs: 10_000 });
    const h = P.engine.postWrite(readOf(D, 'w', g.token, pageRanges([[3, 1]])));
    await P.engine.wait([h], 5000);
  } finally {
    fake.close();
    await Promise.all([P.engine.close(), D.engine.close()]);
  }
});
