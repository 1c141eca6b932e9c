/**
 * The proxy's per-instance count of requests sent (PoolMember.served) only ever grows, yet /metrics
 * exposed it as `# TYPE handoff_proxy_instance_served gauge`. Prometheus' conventions make an
 * accumulating count a counter named `_total`: rate()/increase() are meant for counters (Prometheus
 * 2.47+ annotates them on this name: "metric might not be a counter"), and scrapers that follow the type
 * (an OpenMetrics agent keeps a gauge's last value, a counter's rate) showed a running total where a
 * per-instance request rate was meant.
 *
 * Before the fix: no `handoff_proxy_instance_served_total` counter (a gauge without `_total`). After: a
 * counter per instance, equal to the requests sent there.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { InstancePool } from './instance_pool.ts';
import { ProxyMetrics } from './proxy_metrics.ts';

test('requests sent per instance are a counter named _total, with the count', async () => {
  const prefill = new InstancePool('prefill', ['http://p:1'], 'round-robin');
  const decode = new InstancePool('decode', ['http://d:1', 'http://d:2'], 'round-robin');
  const metrics = new ProxyMetrics([prefill, decode]);
  try {
    const d = decode.members[1]!;
    for (let i = 0; i < 3; i++) {
      decode.acquire(d);
      decode.release(d);
    }
    const { body } = await metrics.text();
    assert.match(body, /^# TYPE handoff_proxy_instance_served_total counter$/m, body);
    assert.match(body, /^handoff_proxy_instance_served_total\{side="decode",url="http:\/\/d:2"\} 3$/m);
    assert.match(body, /^handoff_proxy_instance_served_total\{side="decode",url="http:\/\/d:1"\} 0$/m);
    // Scraped twice: still the count, not added up again.
    assert.match(
      (await metrics.text()).body,
      /^handoff_proxy_instance_served_total\{side="decode",url="http:\/\/d:2"\} 3$/m,
    );
  } finally {
    metrics.close();
  }
});
