/**
 * The serving process's own health on /metrics, under the names Prometheus client libraries use
 * (`process_*`, `nodejs_*`), as vLLM's server exposes them through prometheus_client: memory, CPU,
 * open file descriptors against their limit, and the event loop's delay. A leak shows as a resident
 * size that keeps growing; a connection flood as open fds nearing the limit; a step or handler that
 * blocks the loop as a delay in the hundreds of milliseconds. Everything is read at scrape time, the
 * fd count asynchronously (a directory of up to the fd limit's entries), off any request's path.
 * Linux only for the fd gauges (they read /proc/self); elsewhere they stay at 0.
 */
import { readdir, readFile } from 'node:fs/promises';
import { monitorEventLoopDelay, performance, type IntervalHistogram } from 'node:perf_hooks';
import { Counter, Gauge, type Registry } from 'prom-client';

/** The loop delay sampler's resolution: one timer per instance, this often. */
const LOOP_DELAY_RESOLUTION_MS = 10;

function openFds(): Promise<number | null> {
  return readdir('/proc/self/fd').then(
    (entries) => entries.length,
    // catch-ok: no /proc (not Linux): the gauge is left unset
    () => null,
  );
}

function maxFds(): Promise<number | null> {
  return readFile('/proc/self/limits', 'utf8').then(
    (text) => {
      const soft = Number(
        text
          .split('\n')
          .find((l) => l.startsWith('Max open files'))
          ?.split(/\s+/)[3],
      );
      return Number.isFinite(soft) ? soft : null;
    },
    // catch-ok: no /proc (not Linux): the gauge is left unset
    () => null,
  );
}

/** Registers the process families on `reg`; the returned stop() ends the loop delay sampler. */
export function registerProcessMetrics(reg: Registry): { stop(): void } {
  const delay: IntervalHistogram = monitorEventLoopDelay({ resolution: LOOP_DELAY_RESOLUTION_MS });
  delay.enable();
  const gauge = (name: string, help: string, read: () => number | null | Promise<number | null>): void => {
    new Gauge({
      name,
      help,
      registers: [reg],
      async collect() {
        const v = await read();
        if (v !== null) this.set(v);
      },
    });
  };
  gauge('process_resident_memory_bytes', 'resident memory size in bytes', () => process.memoryUsage().rss);
  gauge('nodejs_heap_size_used_bytes', 'V8 heap in use, in bytes', () => process.memoryUsage().heapUsed);
  gauge('nodejs_heap_size_total_bytes', 'V8 heap reserved, in bytes', () => process.memoryUsage().heapTotal);
  // `external` already includes `arrayBuffers` (Node's docs): adding them counted every Buffer and slab twice.
  gauge(
    'nodejs_external_memory_bytes',
    'memory of C++ objects bound to JS (buffers, slabs)',
    () => process.memoryUsage().external,
  );
  gauge('process_open_fds', 'open file descriptors (sockets included)', openFds);
  gauge('process_max_fds', 'the soft limit on open file descriptors', maxFds);
  gauge('process_start_time_seconds', 'process start, seconds since the Unix epoch', () =>
    Math.round(performance.timeOrigin / 1000),
  );
  let lastCpuS = 0;
  new Counter({
    name: 'process_cpu_seconds_total',
    help: 'user and system CPU time of all the process threads, in seconds',
    registers: [reg],
    collect() {
      const u = process.cpuUsage();
      const s = (u.user + u.system) / 1e6;
      if (s > lastCpuS) this.inc(s - lastCpuS);
      lastCpuS = Math.max(lastCpuS, s);
    },
  });
  // The sampler records each period it measured (the resolution included): the delay is what is beyond it.
  const beyond = (ns: number): number => Math.max(0, ns / 1e6 - LOOP_DELAY_RESOLUTION_MS) / 1000;
  new Gauge({
    name: 'nodejs_eventloop_delay_seconds',
    help: 'event loop delay since the last scrape (a handler or step that blocks the loop shows here)',
    labelNames: ['quantile'],
    registers: [reg],
    collect() {
      const some = delay.count > 0;
      this.set({ quantile: '0.5' }, some ? beyond(delay.percentile(50)) : 0);
      this.set({ quantile: '0.99' }, some ? beyond(delay.percentile(99)) : 0);
      this.set({ quantile: '1' }, some ? beyond(delay.max) : 0);
      delay.reset();
    },
  });
  return { stop: () => delay.disable() };
}
