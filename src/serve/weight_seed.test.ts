/**
 * P/D between instances whose weights differ (`--seed`): the prefill's KV was computed by other weights,
 * so decode must not continue from it. The handshake refuses (PEER_INCOMPATIBLE naming the weight seeds)
 * and the request fails (400: the prefiller it names refused the handshake) instead of answering tokens
 * that neither model would produce (before: 200 with other tokens than colocated).
 * With equal seeds the same flow answers exactly what a colocated instance answers (greedy).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import type { Instance } from './instance.ts';
import { smallInstances } from './small_instances_testkit.ts';

const env = new RealEnv(41);
const start = smallInstances(env);

const body = JSON.stringify({
  prompt: 'the quick brown fox jumps over the lazy dog, and then',
  max_tokens: 8,
  temperature: 0,
});

async function complete(url: string, prefiller?: Instance): Promise<{ status: number; json: any }> {
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (prefiller) headers['x-prefiller-host-port'] = new URL(prefiller.url).host;
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers,
    body,
    signal: AbortSignal.timeout(20_000),
  });
  return { status: r.status, json: await r.json() };
}

test('decode refuses KV from a prefill with other weights (--seed); equal seeds answer as colocated', async () => {
  const colocated = await start({ role: 'both', modelSeed: 1 });
  const want = await complete(colocated.url);
  assert.equal(want.status, 200);
  const decode = await start({ role: 'decode', modelSeed: 1 });
  const same = await start({ role: 'prefill', modelSeed: 1 });
  const ok = await complete(decode.url, same);
  assert.equal(ok.status, 200, JSON.stringify(ok.json));
  assert.equal(ok.json.choices[0].text, want.json.choices[0].text, 'same weights: P/D answers as colocated');

  const other = await start({ role: 'prefill', modelSeed: 2 });
  const got = await complete(decode.url, other);
  // The handshake refuses (PEER_INCOMPATIBLE); decode reports the prefiller it was sent to as refusing it.
  assert.ok(
    got.status === 400 || got.status === 409,
    `other weights: expected a refusal, got ${got.status} '${got.json.choices?.[0]?.text}' (colocated '${want.json.choices[0].text}')`,
  );
  assert.match(got.json.error.message, /incompatible: weight seed (2 != 1|1 != 2)/);
});
