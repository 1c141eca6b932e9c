/**
 * A SIGTERM drain does not wait for a client still trickling its request body (slowloris).
 *
 * A completion whose body is not all in when the drain begins is refused once it is (503 OVERLOADED:
 * prepare() and the sidecar path refuse what was not admitted before the drain). Yet the server counted
 * it as `starting` from its first byte, and drain() waits until nothing is starting: before the fix one
 * client sending its body a byte at a time (Node's requestTimeout lets it for 300 s) held every drain for
 * its whole timeout, for a request the drain would refuse anyway. After: the drain ends at once, and
 * that client, once its body is in, gets the 503.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { smallInstances } from './small_instances_testkit.ts';

const env = new RealEnv(31);
const start = smallInstances(env);

test('a drain is not held by a completion whose body is still arriving, and that request is refused', async () => {
  const inst = await start({ device: 'sim' });
  const url = new URL(inst.url);
  const body = JSON.stringify({ prompt: [1, 2, 3, 4], max_tokens: 4, temperature: 0 });
  const sock = connect(Number(url.port), url.hostname);
  sock.on('error', () => {});
  let answer = '';
  sock.on('data', (b: Buffer) => (answer += b.toString()));
  try {
    await new Promise<void>((r) => sock.once('connect', () => r()));
    sock.write(
      `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body.slice(0, 5)}`,
    );
    await env.sleep(200); // the server has the headers and the first bytes
    const drained = await inst.server.drain(2000);
    assert.equal(drained, true, 'the drain waited its whole timeout for a body still arriving');
    sock.write(body.slice(5));
    for (let k = 0; k < 300 && !answer.includes('\r\n\r\n'); k++) await env.sleep(10);
    assert.match(answer, /^HTTP\/1\.1 503 /, `the late request is refused: ${answer.slice(0, 200)}`);
  } finally {
    sock.destroy();
  }
});
