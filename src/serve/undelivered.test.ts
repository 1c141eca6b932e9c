/**
 * A prefill's answer that never reaches its client (instance_server.ts, `res` closed while not
 * writableFinished): the pages it holds for decode are freed at once through the engine's abort of a
 * finished request (the hold ends: revoke, drain, free), not at the lease. The server's socket swallows
 * what is written to it without ever completing the write (a network that stopped delivering), so the
 * answer is written but never flushed; the client then goes away.
 * Without the server's `undelivered` call the pages would stay held for the 60 s lease and the test
 * would time out waiting for them.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  request as httpRequest,
  type ClientRequest,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from 'node:http';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance } from './instance.ts';

const env = new RealEnv(19);
let inst: Instance | null = null;

after(async () => {
  await inst?.close();
});

async function metric(name: string): Promise<number> {
  const text = await (await fetch(`${inst?.url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`));
  assert.ok(line !== undefined, `metric ${name} is exported`);
  return Number(line.slice(line.lastIndexOf(' ') + 1));
}

async function until(what: string, ok: () => boolean | Promise<boolean>): Promise<void> {
  for (let k = 0; k < 1000; k++) {
    if (await ok()) return;
    await env.sleep(10);
  }
  assert.fail(`timed out waiting for ${what}`);
}

/**
 * The first completion's answer is written but never flushed: its socket queues the bytes for good (a
 * network that stopped delivering, made deterministic; Node's end() uncorks, so corking cannot do it).
 * The instance's HTTP server is private to it: reached here only for that.
 */
function stallFirstAnswer(i: Instance, onStalled: (res: ServerResponse) => void): void {
  const http = (i.server as unknown as { server: Server }).server;
  let stalled = 0;
  http.prependListener('request', (req: IncomingMessage, res: ServerResponse) => {
    if (req.url !== '/v1/completions' || stalled++ > 0) return;
    const socket = res.socket;
    assert.ok(socket !== null);
    let queued = 0;
    socket.write = ((chunk: string | Uint8Array) => {
      queued += typeof chunk === 'string' ? Buffer.byteLength(chunk) : chunk.byteLength;
      return false;
    }) as typeof socket.write;
    Object.defineProperty(socket, 'writableLength', { get: () => queued });
    onStalled(res);
  });
}

test('prefill: an answer written but never flushed to its client ends the hold at once (pages back, hold counted)', async () => {
  inst = await startInstance(
    { ...DEFAULT_INSTANCE_OPTIONS, role: 'prefill', port: 0, numBlocks: 64, scheduler: { maxModelLen: 256 } },
    env,
  );
  let answer: ServerResponse | null = null;
  stallFirstAnswer(inst, (res) => (answer = res));
  const body = JSON.stringify({
    model: 'dsv4-mini',
    prompt: 'a prompt whose pages prefill holds for decode',
    max_tokens: 1,
    kv_transfer_params: { do_remote_decode: true },
  });
  let client: ClientRequest | null = null;
  const closed = new Promise<void>((resolve) => {
    client = httpRequest(`${inst?.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
    });
    client.on('error', () => resolve()); // the socket we destroy below
    client.on('close', () => resolve());
    client.end(body);
  });
  await until('the answer to be written', () => (answer as ServerResponse | null)?.writableEnded === true);
  const res = answer as unknown as ServerResponse;
  assert.equal(res.writableFinished, false, 'the stalled answer is not flushed');
  assert.equal(await metric('handoff_num_requests_held_for_send'), 1, 'prefill holds the pages for decode');
  assert.equal(await metric('handoff_holds_ended_total'), 0);

  (client as unknown as ClientRequest).destroy();
  await closed;
  await until('the hold to end', async () => (await metric('handoff_num_requests_held_for_send')) === 0);
  assert.equal(await metric('handoff_holds_ended_total'), 1, 'the server ended the hold itself');
  assert.equal(await metric('handoff_kv_cache_usage_perc'), 0, 'every page is back');
});

test('an undelivered answer ends only its own request: a retry that reuses its X-Request-Id runs to the end', async () => {
  await inst?.close();
  inst = await startInstance(
    { ...DEFAULT_INSTANCE_OPTIONS, port: 0, numBlocks: 64, scheduler: { maxModelLen: 256 } },
    env,
  );
  let answer: ServerResponse | null = null;
  stallFirstAnswer(inst, (res) => (answer = res)); // the retry's answer flows
  const headers = { 'content-type': 'application/json', 'x-request-id': 'reused-id' };
  const first = JSON.stringify({ model: 'dsv4-mini', prompt: 'the first try', max_tokens: 1 });
  let client: ClientRequest | null = null;
  const closed = new Promise<void>((resolve) => {
    client = httpRequest(`${inst?.url}/v1/completions`, {
      method: 'POST',
      headers: { ...headers, 'content-length': Buffer.byteLength(first) },
    });
    client.on('error', () => resolve());
    client.on('close', () => resolve());
    client.end(first);
  });
  await until('the first answer to be written', () => (answer as ServerResponse | null)?.writableEnded === true);
  // The client retries under the same id on a new connection, then drops the first one.
  const retry = fetch(`${inst.url}/v1/completions`, {
    method: 'POST',
    headers,
    body: JSON.stringify({ model: 'dsv4-mini', prompt: 'the retry', max_tokens: 40, ignore_eos: true }),
  });
  await until('the retry to run', async () => (await metric('handoff_num_requests_running')) === 1);
  (client as unknown as ClientRequest).destroy();
  await closed;
  const res = await retry;
  const body = (await res.json()) as { choices?: Array<{ finish_reason: string }>; error?: unknown };
  assert.equal(res.status, 200, JSON.stringify(body));
  assert.equal(body.choices?.[0]?.finish_reason, 'length', 'the retry was not aborted by the first answer');
});
