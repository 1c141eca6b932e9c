/**
 * Over HTTP: a request whose forward fails on the device gets a 500 OpenAI error JSON (JSON and SSE),
 * while the server stays healthy and a concurrent request completes normally.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { FAILING_KERNELS_URL, FAIL_REQUEST_PREFIX } from '../worker/kernels_testkit.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance } from './instance.ts';

let inst: Instance;
const env = new RealEnv(7);

before(async () => {
  inst = await startInstance(
    {
      ...DEFAULT_INSTANCE_OPTIONS,
      port: 0,
      numBlocks: 160,
      scheduler: { maxModelLen: 512 },
      kernelModuleUrl: FAILING_KERNELS_URL,
    },
    env,
  );
});
after(async () => inst.close());

const body = { prompt: 'The KV cache moved', max_tokens: 4, temperature: 0, ignore_eos: true };
const post = (id: string, extra: Record<string, unknown> = {}) =>
  fetch(`${inst.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': id },
    body: JSON.stringify({ ...body, ...extra }),
  });

test('a kernel failure is a 500 for that request only; the server keeps serving', async () => {
  const [bad, good, badStream] = await Promise.all([
    post(`${FAIL_REQUEST_PREFIX}a`),
    post('ok-1'),
    post(`${FAIL_REQUEST_PREFIX}b`, { stream: true }),
  ]);
  assert.equal(bad.status, 500);
  const err = (await bad.json()) as { error: { code: string; type: string; message: string } };
  assert.equal(err.error.code, 'INTERNAL');
  assert.equal(err.error.type, 'server_error');
  assert.match(err.error.message, /injected kernel failure/);
  assert.equal(good.status, 200);
  assert.equal(((await good.json()) as { choices: Array<{ text: string }> }).choices.length, 1);
  assert.equal(badStream.status, 500, 'a stream that fails before its first token still gets a real status');
  await badStream.text();
  assert.equal((await fetch(`${inst.url}/health`)).status, 200);
  assert.equal((await post('ok-2')).status, 200);
});
