/**
 * The process families on /metrics measure this process: a loop blocked for 150 ms shows as a delay of
 * at least 100 ms in the next scrape (and not in the one right after it), sockets opened here raise the
 * open-fd count by about as many, memory and CPU are positive, and stop() ends the sampler.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:net';
import { performance } from 'node:perf_hooks';
import { Registry } from 'prom-client';
import { registerProcessMetrics } from './process_metrics.ts';

async function values(reg: Registry): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  for (const line of (await reg.metrics()).split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

test('process metrics: loop delay, open fds, memory and CPU of this process', async () => {
  const reg = new Registry();
  const m = registerProcessMetrics(reg);
  try {
    await sleep(50);
    const t0 = performance.now();
    while (performance.now() - t0 < 150); // block the loop
    await sleep(30);
    const a = await values(reg);
    assert.ok((a.get('nodejs_eventloop_delay_seconds{quantile="1"}') ?? 0) >= 0.1, 'the 150 ms block is seen');
    const b = await values(reg); // at once: only what came after the first scrape
    const maxA = a.get('nodejs_eventloop_delay_seconds{quantile="1"}') ?? 0;
    assert.ok((b.get('nodejs_eventloop_delay_seconds{quantile="1"}') ?? Infinity) < maxA, 'each scrape starts over');

    const servers: Server[] = [];
    for (let i = 0; i < 100; i++) {
      const s = createServer();
      await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
      servers.push(s);
    }
    const c = await values(reg);
    for (const s of servers) await new Promise<void>((r) => s.close(() => r()));
    const fdsBefore = b.get('process_open_fds') ?? 0;
    // 100 listening sockets are 100 more fds; the slack is for descriptors the runtime itself closed meanwhile.
    assert.ok((c.get('process_open_fds') ?? 0) >= fdsBefore + 90, `${c.get('process_open_fds')} vs ${fdsBefore}`);
    assert.ok((c.get('process_max_fds') ?? 0) >= (c.get('process_open_fds') ?? Infinity));
    for (const name of ['process_resident_memory_bytes', 'nodejs_heap_size_used_bytes', 'process_cpu_seconds_total'])
      assert.ok((c.get(name) ?? 0) > 0, `${name} is positive`);
    const start = c.get('process_start_time_seconds') ?? 0;
    assert.ok(start > 1.7e9 && start <= Date.now() / 1000, 'the start time is a Unix time in the past');
  } finally {
    m.stop();
  }
});
