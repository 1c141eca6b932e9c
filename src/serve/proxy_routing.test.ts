/**
 * Proxy routing without sockets: round robin and least loaded over healthy members only, null when
 * none is healthy, load accounting; and the P/D request bodies of READ and WRITE with vLLM's fields.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { HandoffError } from '../util/errors.ts';
import { InstancePool } from './instance_pool.ts';
import type { InstanceInfo } from './instance_server.ts';
import { decodeBody, prefillBody, prefillIdentityOf } from './proxy_flow.ts';
import { decodeParamsRead, decodeParamsWrite, prefillAsk } from './pd_flow.ts';

const urls = ['http://a:1', 'http://b:1', 'http://c:1'];

test('round robin cycles over healthy members and skips unhealthy ones', () => {
  const pool = new InstancePool('decode', urls, 'round-robin');
  assert.equal(pool.pick(), null, 'nothing is healthy before the first check');
  for (const m of pool.members) pool.markUp(m);
  assert.deepEqual(
    [1, 2, 3, 4].map(() => pool.pick()?.url),
    ['http://a:1', 'http://b:1', 'http://c:1', 'http://a:1'],
  );
  pool.markDown(pool.members[1]!, 'connection refused');
  assert.deepEqual(
    [1, 2, 3, 4].map(() => pool.pick()?.url),
    ['http://c:1', 'http://a:1', 'http://c:1', 'http://a:1'],
  );
  for (const m of pool.members) pool.markDown(m, 'gone');
  assert.equal(pool.pick(), null);
});

test('least loaded picks the member with the fewest requests in flight', () => {
  const pool = new InstancePool('prefill', urls, 'least-loaded');
  for (const m of pool.members) pool.markUp(m);
  const [a, b, c] = pool.members as [(typeof pool.members)[0], (typeof pool.members)[0], (typeof pool.members)[0]];
  pool.acquire(a);
  pool.acquire(a);
  pool.acquire(b);
  assert.equal(pool.pick()?.url, c.url);
  pool.acquire(c);
  pool.acquire(c);
  assert.equal(pool.pick()?.url, b.url);
  pool.markDown(b, 'x');
  pool.release(a);
  assert.equal(pool.pick()?.url, a.url, 'a (1 in flight) beats c (2); b is down');
  assert.equal(a.served, 2);
});

test('property: least loaded never picks a member busier than another healthy one', () => {
  fc.assert(
    fc.property(fc.array(fc.tuple(fc.boolean(), fc.nat(5)), { minLength: 1, maxLength: 6 }), (spec) => {
      const pool = new InstancePool(
        'decode',
        spec.map((_, i) => `http://h${i}:1`),
        'least-loaded',
      );
      spec.forEach(([up, load], i) => {
        const m = pool.members[i]!;
        if (up) pool.markUp(m);
        for (let k = 0; k < load; k++) pool.acquire(m);
      });
      const picked = pool.pick();
      const healthy = pool.members.filter((m) => m.healthy);
      if (healthy.length === 0) return assert.equal(picked, null);
      assert.ok(picked?.healthy);
      assert.equal(picked.inflight, Math.min(...healthy.map((m) => m.inflight)));
    }),
  );
});

test('READ bodies: prefill computes one token and holds its pages; decode gets the original body and the returned params', () => {
  const body = {
    model: 'm',
    prompt: 'p',
    max_tokens: 30,
    stream: true,
    stream_options: { include_usage: true },
    seed: 3,
  };
  const pre = prefillBody(body, prefillAsk('xfer-1'));
  assert.deepEqual(pre, {
    model: 'm',
    prompt: 'p',
    max_tokens: 1,
    max_completion_tokens: 1,
    stream: false,
    seed: 3,
    kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, transfer_id: 'xfer-1' },
  });
  const returned = {
    do_remote_prefill: true,
    do_remote_decode: false,
    remote_engine_id: 'prefill-1',
    remote_block_ids: [[1, 2]],
    remote_host: 'h',
    remote_port: 5,
    transfer_id: 'xfer-1',
    grant: 'ab',
  };
  const dec = decodeBody(body, decodeParamsRead(returned));
  assert.equal(dec['max_tokens'], 30);
  assert.equal(dec['stream'], true);
  assert.deepEqual(dec['kv_transfer_params'], returned);
  assert.equal(body.max_tokens, 30, 'the original body is not modified');
  assert.throws(
    () => decodeParamsRead(null),
    (e: unknown) => e instanceof HandoffError && e.code === 'TRANSFER_FAILED',
  );
});

test('WRITE bodies: decode names the prefill engine and its side channel, with the same transfer id', () => {
  const info: InstanceInfo = {
    engine_id: 'prefill-9',
    role: 'prefill',
    model: 'dsv4-mini',
    preset: 'dsv4-mini',
    kv_role: 'kv_producer',
    transfer_mode: 'write',
    side_channel_host: '127.0.0.1',
    side_channel_port: 4000,
    data_port: 4001,
    max_model_len: 1024,
    num_pages: 10,
    block_size: 16,
    prefix_cache_groups: [0, 1],
    kv_events_epoch: 'prefill-9',
  };
  const dec = decodeBody({ prompt: 'p' }, decodeParamsWrite(prefillIdentityOf(info), 'xfer-2'));
  assert.deepEqual(dec['kv_transfer_params'], {
    do_remote_prefill: true,
    do_remote_decode: false,
    remote_engine_id: 'prefill-9',
    remote_host: '127.0.0.1',
    remote_port: 4000,
    transfer_id: 'xfer-2',
  });
  assert.throws(
    () => decodeParamsWrite(prefillIdentityOf(null), 'x'),
    (e: unknown) => e instanceof HandoffError && e.code === 'PEER_UNAVAILABLE',
  );
  assert.throws(
    () => decodeParamsWrite(prefillIdentityOf({ ...info, transfer_mode: 'read' }), 'x'),
    (e: unknown) => e instanceof HandoffError && e.code === 'PEER_INCOMPATIBLE',
  );
});
