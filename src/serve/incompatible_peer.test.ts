/**
 * A decode whose prefill refuses the transfer handshake as incompatible (other weights, --seed) answers
 * 409 PEER_INCOMPATIBLE naming the mismatch: the params came from the sidecar (x-prefiller-host-port), so
 * the operator's pairing is wrong, not the client's request. Before: 400 BAD_TRANSFER_PARAMS with param
 * kv_transfer_params.remote_host, blaming the client.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { smallInstances } from './small_instances_testkit.ts';

const env = new RealEnv(47);
const start = smallInstances(env);

test('a prefill refusing the handshake as incompatible is a 409 PEER_INCOMPATIBLE, not a client 400', async () => {
  const decode = await start({ role: 'decode', modelSeed: 1 });
  const other = await start({ role: 'prefill', modelSeed: 2 });
  const r = await fetch(`${decode.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-prefiller-host-port': new URL(other.url).host },
    body: JSON.stringify({ prompt: 'the quick brown fox jumps over the lazy dog', max_tokens: 4, temperature: 0 }),
    signal: AbortSignal.timeout(20_000),
  });
  const json = (await r.json()) as { error: { code: string; message: string; param: string | null } };
  assert.equal(r.status, 409, JSON.stringify(json));
  assert.equal(json.error.code, 'PEER_INCOMPATIBLE');
  assert.equal(json.error.param, null, 'no request field is to blame');
  assert.match(json.error.message, /weight seed (2 != 1|1 != 2)/);
});
