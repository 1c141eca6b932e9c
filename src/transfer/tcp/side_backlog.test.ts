/**
 * Proves that a side-channel peer which sends notifications but never reads its acks cannot make the
 * engine buffer acks without bound. The side channel answered every notify with an ack written to the
 * socket whatever was already waiting there, so such a peer grew the engine's memory by ~30 bytes per
 * ~80-byte notify for as long as it sent. Now the connection stops reading the peer's messages while
 * SIDE_SEND_HIGH_WATER bytes of answers wait, until they drain (as the data plane does, read_backlog).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { RealEnv } from '../../util/env.ts';
import { makeNode } from '../testing/conformance.ts';
import { FrameDecoder, encodeFrame, type ControlFrame } from './frame.ts';
import type { SideConn } from './tcp_side_channel.ts';

const env = new RealEnv(3);

test('a side-channel peer that never reads its acks cannot grow the engine acks without bound', async () => {
  const P = await makeNode('tcp', 61, { engineId: 'ackP' });
  const s = net.connect({ host: '127.0.0.1', port: P.engine.address().port });
  s.on('error', () => {});
  try {
    const frames: ControlFrame[] = [];
    const dec = new FrameDecoder({ frame: (f) => void frames.push(f), data: () => assert.fail('no DATA') });
    s.on('data', (d: Buffer) => dec.push(d));
    const next = async (): Promise<ControlFrame> => {
      for (let i = 0; i < 200 && frames.length === 0; i++) await env.sleep(10);
      return frames.shift() as ControlFrame;
    };
    const challenge = await next();
    assert.equal(challenge.type === 'side' && (challenge.body as { m: string }).m, 'challenge');
    const hello = {
      m: 'hello',
      meta: { ...P.engine.metadata, engineId: 'ack-flooder' },
      proof: '',
      nonce: 'ab'.repeat(16),
      dataHost: '127.0.0.1',
      dataPort: 9,
      session: 'cd'.repeat(16),
    };
    s.write(encodeFrame({ type: 'side', body: hello }));
    const welcome = await next();
    assert.equal(welcome.type === 'side' && (welcome.body as { m: string }).m, 'welcome');
    // From now on the peer never reads: every ack the engine writes stays with the engine once the
    // kernel buffers are full.
    s.pause();
    s.removeAllListeners('data');
    const N = 220_000;
    const batch: Uint8Array[] = [];
    for (let seq = 0; seq < N; seq++) {
      batch.push(
        encodeFrame({ type: 'side', body: { m: 'notify', seq, n: { type: 'remote_blocks', transferId: 'x' } } }),
      );
      if (batch.length === 10_000) s.write(Buffer.concat(batch.splice(0)));
    }
    const conn = (): SideConn | undefined =>
      (P.engine as unknown as { conns: Map<string, SideConn> }).conns.get('ack-flooder');
    const waiting = (): number => conn()?.socket.writableLength ?? -1;
    // Until the engine stopped taking notifications for 500 ms.
    for (let last = -2, stable = 0; stable < 5;) {
      await env.sleep(100);
      const read = conn()?.socket.bytesRead ?? -1;
      stable = read === last ? stable + 1 : 0;
      last = read;
    }
    assert.ok(waiting() >= 0, 'the connection is still up');
    assert.ok(waiting() < 512 << 10, `the engine holds ${waiting()} bytes of acks for a peer that reads nothing`);
  } finally {
    s.destroy();
    await P.engine.close();
  }
});
