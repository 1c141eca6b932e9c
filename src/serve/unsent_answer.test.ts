/**
 * A client can leave a finished answer unsendable for as long as it likes: it pipelines a completion on
 * one keep-alive connection behind a response that never ends (here its own KV event stream; a stream it
 * stops reading does the same once the kernel's buffers are full). Node computes the completion at once
 * but queues its answer behind the first response, so the answer is never flushed and its request stays
 * live: nothing bounded it (the instance has no write timeout), and a SIGTERM drain waited its whole
 * timeout for it. An answer that is not taken within the client stall bound is dropped now (its
 * connection closed), like the proxy's client that stops reading (proxy_relay.ts CLIENT_STALL_MS).
 * Worse, such an answer never got its response's 'close' even once the client closed the connection
 * (a queued response has no socket), so it stayed live for the life of the process: the second test.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { connect, type Socket } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance } from './instance.ts';

const env = new RealEnv(43);
let inst: Instance;
let patient: Instance;

before(async () => {
  const o = {
    ...DEFAULT_INSTANCE_OPTIONS,
    port: 0,
    device: 'sim' as const,
    numBlocks: 64,
    scheduler: { maxModelLen: 128 },
  };
  [inst, patient] = await Promise.all([startInstance({ ...o, clientStallMs: 1000 }, env), startInstance(o, env)]);
});

after(async () => {
  await Promise.all([inst.close(), patient.close()]);
});

async function metric(inst: Instance, name: string): Promise<number> {
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'gm');
  let sum = 0;
  for (const x of (await inst.server.metrics.text()).body.matchAll(m)) sum += Number(x[1]);
  return sum;
}

/** A streamed completion pipelined behind the client's own KV event stream, once it was computed. */
async function pipelined(inst: Instance): Promise<Socket> {
  const url = new URL(inst.url);
  const body = JSON.stringify({ prompt: [1, 2, 3, 4], max_tokens: 4, temperature: 0, stream: true });
  const socket = connect(Number(url.port), url.hostname);
  socket.on('error', () => undefined); // catch-ok: the server may close it; nothing to check here
  socket.write(
    `GET /handoff/kv_events HTTP/1.1\r\nHost: x\r\n\r\n` +
      `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
  );
  const deadline = env.nowMs() + 20_000;
  while ((await metric(inst, 'handoff_requests_total')) < 1 && env.nowMs() < deadline) await env.sleep(20);
  assert.equal(await metric(inst, 'handoff_requests_total'), 1, 'the pipelined completion was computed');
  assert.equal(inst.server.numLive, 1, 'and its answer is not sent');
  return socket;
}

test('an answer queued behind a response that never ends does not stay live or hold the drain', async () => {
  const socket = await pipelined(inst);
  try {
    const drained = await inst.server.drain(4_000);
    assert.equal(inst.server.numLive, 0, 'the finished answer nobody can take is still live');
    assert.ok(drained, 'the drain waited its whole timeout for an answer the client does not take');
  } finally {
    socket.destroy();
  }
});

test('an answer queued behind another is not live once its client closed the connection', async () => {
  (await pipelined(patient)).destroy();
  const deadline = env.nowMs() + 3_000;
  while (patient.server.numLive > 0 && env.nowMs() < deadline) await env.sleep(20);
  assert.equal(patient.server.numLive, 0, 'the request of a client long gone is still live');
});
