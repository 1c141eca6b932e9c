/**
 * A READ-mode `release` for a transfer that has no live grant (a duplicate release, one after the
 * lease, or one forged with any token through decode's POST /handoff/release) is not refused: it reaches
 * the Producer, which keeps it as "released early" and applies it to the NEXT transfer under that id.
 * That transfer's pages are then freed at once while its fresh grant is still live, so the grantee's READ
 * is served from pages the pool has handed to another request: decode loads someone else's KV.
 *
 * Here over HTTP only (a client of the instances' APIs): a release of transfer 'review-x' with a made-up
 * grant, then a prefill that names transfer_id 'review-x'. Its pages must stay held for decode's READ,
 * and decode must get its own KV (its answer equals a colocated instance's).
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance, type InstanceOptions } from './instance.ts';

const env = new RealEnv(29);
let colocated: Instance;
let p: Instance;
let d: Instance;

function opts(role: InstanceOptions['role'], numBlocks: number): InstanceOptions {
  return { ...DEFAULT_INSTANCE_OPTIONS, role, port: 0, numBlocks, scheduler: { maxModelLen: 256 } };
}

before(async () => {
  [colocated, p, d] = await Promise.all([
    startInstance(opts('both', 96), env),
    startInstance(opts('prefill', 34), env),
    startInstance(opts('decode', 96), env),
  ]);
});
after(async () => {
  await Promise.all([colocated, p, d].map((i) => i.close()));
});

async function post(i: Instance, path: string, body: unknown): Promise<{ status: number; json: any }> {
  const r = await fetch(`${i.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(60_000),
  });
  const text = await r.text();
  return { status: r.status, json: JSON.parse(text) };
}

async function metric(i: Instance, name: string): Promise<number> {
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'm').exec((await i.server.metrics.text()).body);
  return Number(m?.[1] ?? 0);
}

const attacker = Array.from({ length: 70 }, (_, i) => 300 + ((i * 7) % 500));
const victims = [0, 1].map((k) => Array.from({ length: 160 }, (_, i) => 1000 + ((i * 13 + k * 101) % 900)));
const ids = (j: any): number[] => j.choices[0].token_ids as number[];

test('READ: a release with no live grant is not kept to free the next transfer under that id', async () => {
  const base = { prompt: attacker, max_tokens: 6, temperature: 0, return_token_ids: true };
  const want = ids((await post(colocated, '/v1/completions', base)).json);

  // 1. A release of 'review-x' that proves nothing (no grant exists for it yet).
  const info = p.info;
  const forged = {
    do_remote_prefill: true,
    remote_engine_id: info.engine_id,
    remote_host: info.side_channel_host,
    remote_port: info.side_channel_port,
    remote_block_ids: [[]],
    transfer_id: 'review-x',
    grant: '00'.repeat(16),
  };
  const rel = await post(d, '/handoff/release', { kv_transfer_params: forged });
  assert.equal(rel.status, 200, JSON.stringify(rel.json));
  await env.sleep(500); // the release reaches prefill (handshake, then the notification)

  // 2. Prefill under transfer_id 'review-x': its pages are held for decode, under a fresh grant.
  const pre = await post(p, '/v1/completions', {
    ...base,
    max_tokens: 1,
    kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, transfer_id: 'review-x' },
  });
  assert.equal(pre.status, 200, JSON.stringify(pre.json));
  const params = pre.json.kv_transfer_params as Record<string, unknown>;
  assert.equal(typeof params['grant'], 'string');
  await env.sleep(300); // a few engine steps
  const held = await metric(p, 'handoff_num_requests_held_for_send');

  // 3. Other requests take the pool's pages (34 pages: two of 20 pages each, one after the other).
  for (const victim of victims) {
    const other = await post(p, '/v1/completions', { prompt: victim, max_tokens: 1, temperature: 0 });
    assert.equal(other.status, 200, JSON.stringify(other.json));
  }

  // 4. Decode READs under the grant prefill returned.
  const dec = await post(d, '/v1/completions', {
    ...base,
    kv_transfer_params: { ...params, do_remote_prefill: true, do_remote_decode: false },
  });
  assert.equal(held, 1, 'prefill freed the pages it had just granted (held_for_send 0 with the grant live)');
  assert.equal(dec.status, 200, JSON.stringify(dec.json));
  assert.deepEqual(ids(dec.json), want, "decode loaded KV that is not its prompt's");
});
