/**
 * A request body's size did not bound the work of parsing it. 4 MiB of
 * nested arrays in an ignored field blocked the event loop 3.5-4.5 s in JSON.parse (and the request was
 * then answered 200), and 200k keys in `metadata` 1.5 s (JSON.parse, then zod's record): every other
 * request of the server, /health included, waited that long. Proves: such bodies are refused with
 * a 400 naming the limit before JSON.parse, the event loop is never blocked long meanwhile, legitimate
 * extreme bodies (a chat of 256 messages of 64 parts, a prompt of 65k token ids) pass the shape check,
 * and brackets, quotes and colons inside strings are not counted.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { request as httpRequest } from 'node:http';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { RealEnv } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance } from './instance.ts';
import { checkJsonShape, JSON_DEPTH_MAX, JSON_OBJECT_KEYS_MAX } from './json_shape.ts';

const env = new RealEnv(11);
let inst: Instance;

before(async () => {
  const opts = { ...DEFAULT_INSTANCE_OPTIONS, port: 0, preset: 'llama-mini' as const, numBlocks: 64 };
  inst = await startInstance({ ...opts, scheduler: { maxModelLen: 256 } }, env);
});

after(async () => {
  await inst.close();
});

/** POST `body` (node:http, from one buffer: fetch's own encoding of 4 MiB would block this process too). */
function postRaw(body: Buffer): Promise<{ status: number; text: string }> {
  const { port } = new URL(inst.url);
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        host: '127.0.0.1',
        port,
        method: 'POST',
        path: '/v1/completions',
        headers: { 'content-type': 'application/json' },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') }));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

/**
 * POST `body` and the longest event-loop block meanwhile (ms). Server and client share this process, so
 * a block in the server's handler is a block here (a /health probe in flight waits for it just as long).
 */
async function sendMeasuringLoop(text: string): Promise<{ status: number; text: string; blockedMs: number }> {
  const body = Buffer.from(text);
  await (await fetch(`${inst.url}/health`)).text();
  const delay = monitorEventLoopDelay({ resolution: 10 });
  delay.enable();
  const health = fetch(`${inst.url}/health`).then((r) => r.text());
  const answer = await postRaw(body);
  await health;
  delay.disable();
  return { ...answer, blockedMs: delay.max / 1e6 };
}

// A refused body costs tens to a couple hundred ms here; parsing these took 1.5-4.5 s before the check.
// Loose: the refusal (status 400) is what a regression breaks first; the old code blocked 1.5-4.5 s here,
// the new one 0.1-0.2 s, and a loaded CI machine must not turn scheduling noise into a failure.
const BLOCKED_BOUND_MS = 1200;

test('4 MiB of nested arrays: refused at once, the event loop never blocks', async () => {
  const n = 1_900_000;
  const body = `{"prompt":"hi","max_tokens":1,"x_ignored":${'['.repeat(n)}${']'.repeat(n)}}`;
  const r = await sendMeasuringLoop(body);
  console.log(`# nested arrays: status ${r.status}, event loop blocked ${r.blockedMs.toFixed(0)} ms`);
  assert.equal(r.status, 400, r.text);
  assert.ok(r.blockedMs < BLOCKED_BOUND_MS, `the event loop was blocked for ${r.blockedMs.toFixed(0)} ms`);
  assert.equal(JSON.parse(r.text).error.code, 'BAD_REQUEST');
  assert.match(JSON.parse(r.text).error.message, /deeper than 64 levels/);
});

test('200k keys in metadata: refused at once, the event loop never blocks', async () => {
  const keys = Array.from({ length: 200_000 }, (_, i) => `"k${i}":${i}`).join(',');
  const r = await sendMeasuringLoop(`{"prompt":"hi","max_tokens":1,"metadata":{${keys}}}`);
  console.log(`# metadata keys: status ${r.status}, event loop blocked ${r.blockedMs.toFixed(0)} ms`);
  assert.equal(r.status, 400, r.text);
  assert.ok(r.blockedMs < BLOCKED_BOUND_MS, `the event loop was blocked for ${r.blockedMs.toFixed(0)} ms`);
  assert.match(JSON.parse(r.text).error.message, /more than \d+ keys/);
});

test('the server still answers an ordinary request', async () => {
  const r = await sendMeasuringLoop(JSON.stringify({ prompt: 'hi', max_tokens: 1, metadata: { a: 'b' } }));
  assert.equal(r.status, 200, r.text);
});

test('shape check: the largest legitimate bodies pass, brackets and colons in strings do not count', () => {
  const part = { type: 'text', text: '[[[{:' };
  const chat = { messages: Array.from({ length: 256 }, () => ({ role: 'user', content: Array(64).fill(part) })) };
  const bytes = (v: unknown): Uint8Array => new TextEncoder().encode(typeof v === 'string' ? v : JSON.stringify(v));
  checkJsonShape(bytes(chat));
  checkJsonShape(bytes({ prompt: Array.from({ length: 65535 }, (_, i) => i % 50000) }));
  checkJsonShape(bytes({ prompt: `${'['.repeat(1000)}\\"${'{'.repeat(1000)}` }));
  const deep = (d: number): string => `${'['.repeat(d)}${']'.repeat(d)}`;
  checkJsonShape(bytes(deep(JSON_DEPTH_MAX)));
  assert.throws(() => checkJsonShape(bytes(deep(JSON_DEPTH_MAX + 1))), HandoffError);
  const obj = (k: number): string => `{${Array.from({ length: k }, (_, i) => `"k${i}":1`).join(',')}}`;
  checkJsonShape(bytes(obj(JSON_OBJECT_KEYS_MAX)));
  assert.throws(() => checkJsonShape(bytes(obj(JSON_OBJECT_KEYS_MAX + 1))), /more than 1024 keys/);
  assert.throws(() => checkJsonShape(bytes(`[${Array(70_000).fill('[]').join(',')}]`)), /objects and arrays/);
});
