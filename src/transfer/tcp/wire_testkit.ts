/**
 * Test kit for the hostile-peer tests (conn_slots, engine_id_clash, orphan_data_conns, peer_conn_cap,
 * session_refresh, side_backlog): a framed raw socket, and the side-channel
 * handshake of a client that is not an engine (no secret set), to get a data session from a live engine.
 */
import assert from 'node:assert/strict';
import net from 'node:net';
import { RealEnv } from '../../util/env.ts';
import type { Node } from '../testing/conformance.ts';
import { FrameDecoder, encodeFrame, type ControlFrame } from './frame.ts';

const env = new RealEnv(9);

/** A socket to `port` whose frames are queued; next() waits for one. */
export function framed(port: number): { s: net.Socket; next: () => Promise<ControlFrame> } {
  const s = net.connect({ host: '127.0.0.1', port });
  s.on('error', () => {});
  const frames: ControlFrame[] = [];
  const dec = new FrameDecoder({ frame: (f) => void frames.push(f), data: () => assert.fail('no DATA') });
  s.on('data', (d: Buffer) => dec.push(d));
  const next = async (): Promise<ControlFrame> => {
    for (let i = 0; i < 500 && frames.length === 0 && !s.destroyed; i++) await env.sleep(5);
    const f = frames.shift();
    assert.ok(f !== undefined, 'no frame came');
    return f;
  };
  return { s, next };
}

/** Handshake with `P` as `engineId` on a raw side channel; returns it and the data session P gave. */
export async function rawHandshake(
  P: Node,
  engineId: string,
): Promise<{ side: ReturnType<typeof framed>; session: string }> {
  const side = framed(P.engine.address().port);
  await side.next(); // challenge
  const hello = {
    m: 'hello',
    meta: { ...P.engine.metadata, engineId },
    proof: '',
    nonce: 'ab'.repeat(16),
    dataHost: '127.0.0.1',
    dataPort: 9,
    session: 'cd'.repeat(16),
  };
  side.s.write(encodeFrame({ type: 'side', body: hello }));
  const welcome = (await side.next()) as { type: 'side'; body: { m: string; session: string } };
  assert.equal(welcome.body.m, 'welcome');
  return { side, session: welcome.body.session };
}

/** A data connection to `P` that said hello as `engineId` with `session` and got helloOk. */
export async function greetedDataConn(P: Node, engineId: string, session: string): Promise<net.Socket> {
  const data = framed(P.engine.ports().data);
  data.s.write(encodeFrame({ type: 'hello', engineId, session }));
  assert.deepEqual(await data.next(), { type: 'helloOk' });
  return data.s;
}
