/**
 * Proves a handshake that fails leaves the listener no way into our data plane. The dialer registers the
 * data session it offers in its hello with its NIC before the listener answered; when the listener then
 * fails the handshake (here: it cannot prove the side channel secret, so handshake() rejects UNAUTHORIZED)
 * the session stayed registered, and the impostor said hello on our data port with it and was admitted,
 * against tcp.ts's contract ("the data plane is only reachable through a handshake, and hence through the
 * shared secret"). Its claimed engine id also took one of the 4 session slots of that id, evicting the real
 * engine's sessions after a few such dials (any client can make us dial an address of its choosing).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { isHandoffError } from '../../util/errors.ts';
import { makeNode } from '../testing/conformance.ts';
import { framed } from './wire_testkit.ts';
import { FrameDecoder, encodeFrame, type ControlFrame } from './frame.ts';

/** A side-channel listener that challenges, keeps the session of the hello, and answers with a bad proof. */
async function impostor(engineId: string): Promise<{ port: number; session: Promise<string>; close: () => void }> {
  const sockets: net.Socket[] = [];
  let got: (s: string) => void = () => {};
  const session = new Promise<string>((resolve) => (got = resolve));
  const server = net.createServer((s) => {
    sockets.push(s);
    s.on('error', () => {});
    const dec = new FrameDecoder({
      frame: (f: ControlFrame) => {
        if (f.type !== 'side') return;
        const hello = f.body as { m: string; session: string; meta: unknown };
        if (hello.m !== 'hello') return;
        got(hello.session);
        const welcome = {
          m: 'welcome',
          meta: { ...(hello.meta as object), engineId },
          proof: '00'.repeat(32),
          dataHost: '127.0.0.1',
          dataPort: 9,
          session: 'cd'.repeat(16),
        };
        s.write(encodeFrame({ type: 'side', body: welcome }));
      },
      data: () => {},
    });
    s.on('data', (d: Buffer) => dec.push(d));
    s.write(encodeFrame({ type: 'side', body: { m: 'challenge', nonce: 'ab'.repeat(16), engineId } }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  const port = (server.address() as net.AddressInfo).port;
  return {
    port,
    session,
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

test('a dial the listener failed (bad secret proof) gives it no data session on our NIC', async () => {
  const D = await makeNode('tcp', null, { engineId: 'dial-victim', sideChannelSecret: 'the-secret' });
  const fake = await impostor('fake-P');
  try {
    await assert.rejects(
      D.engine.handshake({ host: '127.0.0.1', port: fake.port }),
      (e: unknown) => isHandoffError(e) && e.code === 'UNAUTHORIZED',
    );
    const session = await fake.session;
    const data = framed(D.engine.ports().data);
    data.s.write(encodeFrame({ type: 'hello', engineId: 'fake-P', session }));
    // Admitted: helloOk. Refused: the NIC closes the connection without a frame.
    const answer = await data.next().then(
      (f) => f.type,
      () => 'closed',
    );
    data.s.destroy();
    assert.equal(answer, 'closed', 'the impostor got a data session from a failed handshake');
  } finally {
    fake.close();
    await D.engine.close();
  }
});
