/**
 * tcp handshake against a peer that accepts the connection and never answers (issue 11 item 3):
 * every handshake rejects after its timeout, and the socket it opened is closed, so repeated
 * attempts leave no ESTABLISHED connection and no file descriptor behind.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import { RealEnv } from '../../util/env.ts';
import { isHandoffError } from '../../util/errors.ts';
import { makeNode } from '../testing/conformance.ts';

const env = new RealEnv(5);
const openFds = (): number => fs.readdirSync('/proc/self/fd').length;

/** Poll until `cond` holds; a liveness bound, not a speed check. */
async function eventually(what: string, cond: () => boolean, boundMs = 10_000): Promise<void> {
  const deadline = env.nowMs() + boundMs;
  while (!cond()) {
    if (env.nowMs() > deadline) assert.fail(`${what}: still not true after ${boundMs} ms`);
    await env.sleep(20);
  }
}

test('a handshake that times out closes its socket: the silent peer sees every connection closed, no fd leaks', async () => {
  const accepted: net.Socket[] = [];
  let closed = 0;
  const silent = net.createServer((s) => {
    accepted.push(s);
    s.on('error', () => {});
    s.on('close', () => closed++);
  });
  await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', () => resolve()));
  const port = (silent.address() as net.AddressInfo).port;
  const D = await makeNode('tcp', null, { engineId: 'hs-timeout', handshakeTimeoutMs: 150 });
  try {
    const fdsBefore = openFds();
    const attempts = 3;
    for (let i = 0; i < attempts; i++) {
      await assert.rejects(
        D.engine.handshake({ host: '127.0.0.1', port }),
        (e: unknown) => isHandoffError(e) && e.code === 'PEER_UNAVAILABLE' && /no answer/.test(e.message),
      );
    }
    await eventually(`the silent peer accepted ${attempts} connections`, () => accepted.length === attempts);
    await eventually(`all ${attempts} accepted connections closed (closed ${closed})`, () => closed === attempts);
    await eventually(`fds back to ${fdsBefore} (now ${openFds()})`, () => openFds() === fdsBefore);
  } finally {
    for (const s of accepted) s.destroy();
    await new Promise<void>((resolve) => silent.close(() => resolve()));
    await D.engine.close();
  }
});
