/**
 * Instance configuration: --role sets the default kv_role of --kv-transfer-config, a contradicting
 * kv_role or bad JSON is BAD_CONFIG, colocated runs without a connector unless asked, and a pool too
 * small for one max-length request is refused before anything starts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { DEFAULT_INSTANCE_OPTIONS, resolveTransferConfig, startInstance } from './instance.ts';

const badConfig = (e: unknown): boolean => e instanceof HandoffError && e.code === 'BAD_CONFIG';

test('role defaults: prefill = producer, decode = consumer, READ mode; colocated has no connector', () => {
  assert.equal(resolveTransferConfig('prefill', null)?.role, 'producer');
  assert.equal(resolveTransferConfig('decode', null)?.role, 'consumer');
  assert.equal(resolveTransferConfig('decode', null)?.mode, 'read');
  assert.equal(resolveTransferConfig('both', null), null);
  assert.equal(resolveTransferConfig('both', '{"kv_role": "kv_both"}')?.role, 'both');
  assert.equal(resolveTransferConfig('both', '{"kv_connector": "NullConnector"}'), null);
  const w = resolveTransferConfig('decode', { kv_connector_extra_config: { read_mode: false, lease_ms: 500 } });
  assert.equal(w?.mode, 'write');
  assert.equal(w?.leaseMs, 500);
});

test('contradictions and malformed configs are BAD_CONFIG', () => {
  assert.throws(() => resolveTransferConfig('prefill', '{"kv_role": "kv_consumer"}'), badConfig);
  assert.throws(() => resolveTransferConfig('decode', '{oops'), badConfig);
  assert.throws(() => resolveTransferConfig('decode', '[1]'), badConfig);
  assert.throws(() => resolveTransferConfig('decode', '{"kv_connector_extra_config": {"lease_ms": -1}}'), badConfig);
  assert.throws(() => resolveTransferConfig('decode', '{"kv_connector": "Nope"}'), badConfig);
});

test('a pool that cannot hold one request of max_model_len is refused at startup', async () => {
  await assert.rejects(
    startInstance(
      { ...DEFAULT_INSTANCE_OPTIONS, port: 0, device: 'sim', numBlocks: 16, scheduler: { maxModelLen: 1024 } },
      new RealEnv(1),
    ),
    badConfig,
  );
});
