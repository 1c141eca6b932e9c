/**
 * Proves benchTransfer runs end to end on both backends and reports the DESIGN.md §10 contract:
 * the bytes it claims to move (2 slabs x pages x pageBytes), verified byte for byte inside the bench
 * (a corrupted transfer throws), with finite positive rates. Speed itself is never a pass/fail.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { benchTransfer, benchTransferPoint } from './bench.ts';

for (const backend of ['inproc', 'tcp'] as const) {
  for (const scatter of [false, true]) {
    test(`benchTransfer ${backend}${scatter ? ' (scattered pages)' : ''}: moves and verifies every byte, reports the contract keys`, async () => {
      const r = await benchTransfer({
        backend,
        env: new RealEnv(5),
        pageBytes: 32 * 1024,
        pages: 24,
        repeats: 2,
        scatter,
      });
      assert.deepEqual(Object.keys(r).sort(), ['backend', 'baselineGbps', 'bytes', 'gbps', 'pageBytes', 'ratio']);
      assert.equal(r.backend, backend);
      assert.equal(r.bytes, 2 * 24 * 32 * 1024);
      for (const x of [r.gbps, r.baselineGbps, r.ratio]) assert.ok(Number.isFinite(x) && x > 0);
      assert.ok(Math.abs(r.ratio - r.gbps / r.baselineGbps) < 1e-9);
    });
  }
}

test('benchTransferPoint inproc: the baseline is memcpy on the serving NIC thread (verified), the hot memcpy and the round trip reported beside', async () => {
  const p = await benchTransferPoint({
    backend: 'inproc',
    env: new RealEnv(6),
    pageBytes: 4096,
    pages: 16,
    repeats: 2,
  });
  assert.match(p.baseline, /serving NIC thread/);
  assert.ok(p.hotMemcpyGbps !== undefined && Number.isFinite(p.hotMemcpyGbps) && p.hotMemcpyGbps > 0);
  // The round trip is the baseline's own copy plus two thread hops: on 64 KiB the hops dominate.
  assert.ok(p.roundTripGbps !== undefined && p.roundTripGbps > 0 && p.roundTripGbps < p.baselineGbps);
  const t = await benchTransferPoint({ backend: 'tcp', env: new RealEnv(6), pageBytes: 4096, pages: 16, repeats: 2 });
  assert.equal(t.hotMemcpyGbps, undefined, 'tcp has no memcpy beside its raw socket');
  assert.equal(t.roundTripGbps, undefined);
});
