/**
 * nodejs_external_memory_bytes measures memory bound to JS once: Node's `memoryUsage().external` already
 * includes `arrayBuffers` (Buffers, KV slabs), so adding the two counted every ArrayBuffer twice. A 64 MiB
 * ArrayBuffer allocated here must raise the gauge by about 64 MiB, not 128 MiB.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Registry } from 'prom-client';
import { registerProcessMetrics } from './process_metrics.ts';

async function external(reg: Registry): Promise<number> {
  const line = (await reg.metrics()).split('\n').find((l) => l.startsWith('nodejs_external_memory_bytes '));
  assert.ok(line !== undefined, 'nodejs_external_memory_bytes is exported');
  return Number(line.slice(line.lastIndexOf(' ') + 1));
}

test('nodejs_external_memory_bytes counts a 64 MiB ArrayBuffer once', async () => {
  const reg = new Registry();
  const m = registerProcessMetrics(reg);
  try {
    const before = await external(reg);
    const slab = new Uint8Array(64 << 20).fill(1);
    const grown = (await external(reg)) - before;
    assert.equal(slab[0], 1);
    const mib = grown / 2 ** 20;
    assert.ok(mib >= 60 && mib <= 70, `the gauge grew by ${mib.toFixed(1)} MiB for a 64 MiB ArrayBuffer`);
  } finally {
    m.stop();
  }
});
