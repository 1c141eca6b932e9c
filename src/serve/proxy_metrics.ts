/** /metrics of the proxy: requests by outcome, and per instance its health and requests in flight. */
import { Counter, Gauge, Registry } from 'prom-client';
import type { InstancePool } from './instance_pool.ts';
import { registerProcessMetrics } from './process_metrics.ts';

export type ProxyOutcome = 'ok' | 'error' | 'client_abort';

export class ProxyMetrics {
  readonly registry = new Registry();
  private readonly requests: Counter<'outcome'>;
  private readonly routes: Counter<'path'>;
  private readonly retries: Counter;
  private readonly processMetrics: { stop(): void };

  constructor(pools: readonly InstancePool[]) {
    const reg = this.registry;
    this.requests = new Counter({
      name: 'handoff_proxy_requests_total',
      help: 'completions handled, by outcome',
      labelNames: ['outcome'],
      registers: [reg],
    });
    this.routes = new Counter({
      name: 'handoff_proxy_routes_total',
      help: 'requests by path: pd (prefill then decode) or decode-only (decode held the prefix: no remote prefill)',
      labelNames: ['path'],
      registers: [reg],
    });
    this.retries = new Counter({
      name: 'handoff_proxy_retries_total',
      help: 'requests retried on another instance (one died or was draining before anything was streamed)',
      registers: [reg],
    });
    const perMember = (name: string, help: string, f: (m: InstancePool['members'][number]) => number): void => {
      new Gauge({
        name,
        help,
        labelNames: ['side', 'url'],
        registers: [reg],
        collect() {
          for (const p of pools) for (const m of p.members) this.set({ side: p.side, url: m.url }, f(m));
        },
      });
    };
    perMember('handoff_proxy_instance_healthy', '1 when the instance passed its last health check', (m) =>
      m.healthy ? 1 : 0,
    );
    perMember(
      'handoff_proxy_instance_inflight',
      'requests in flight to the instance through this proxy',
      (m) => m.inflight,
    );
    // Requests sent so far only ever grow: a counter (`_total`), so rate() and scrapers that keep a gauge's
    // last value (a per-instance request rate) read it as one.
    new Counter({
      name: 'handoff_proxy_instance_served_total',
      help: 'requests sent to the instance so far',
      labelNames: ['side', 'url'],
      registers: [reg],
      collect() {
        this.reset();
        for (const p of pools) for (const m of p.members) this.inc({ side: p.side, url: m.url }, m.served);
      },
    });
    this.processMetrics = registerProcessMetrics(reg);
  }

  count(outcome: ProxyOutcome): void {
    this.requests.inc({ outcome });
  }
  routed(path: 'pd' | 'decode-only'): void {
    this.routes.inc({ path });
  }
  retried(): void {
    this.retries.inc();
  }

  async text(): Promise<{ contentType: string; body: string }> {
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }

  /** Stop the process metrics' event-loop sampler (the proxy is closing). */
  close(): void {
    this.processMetrics.stop();
  }
}
