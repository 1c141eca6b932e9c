/**
 * /metrics for one instance: a prom-client Registry of its own (several instances can live in one
 * process in tests). Gauges and counters are read from the engine's plain stats at scrape time
 * (`collect`), so the engine never calls into metrics; latency histograms are fed by the server.
 * Cumulative engine stats are exposed as counters that advance by the difference since the last scrape.
 */
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { TransferStats } from '../transfer/core/types.ts';
import { registerProcessMetrics } from './process_metrics.ts';

/** Everything read from the engine at scrape time (plain data). */
export interface InstanceStatsSnapshot {
  running: number;
  waiting: number;
  heldForSend: number;
  kvUsage: number;
  freePages: number;
  totalPages: number;
  preemptions: number;
  pagesZeroListed: number;
  pagesExcludedFromZeroing: number;
  pagesZeroed: number;
  /** Pages a load filled only in part whose clipped tail was zeroed once it landed (issue 14). */
  pagesTailZeroed: number;
  kvLoadFailures: number;
  leasesExpired: number;
  /** Held prefill pages freed at once because their answer never reached the client. */
  holdsEnded: number;
  engineSteps: number;
  transfer: TransferStats | null;
  /** Races reported by the device's race checker (null when --race-check is off). */
  races: number | null;
  /** Page lifecycle violations (engine/lifecycle_oracle.ts; absent or null when --race-check is off). */
  lifecycleViolations?: number | null;
  /** READ latencies (ms) since the last call, post → landed, per request (drained: read once per scrape). */
  drainReadLatenciesMs: () => number[];
}

const LATENCY_BUCKETS_S = [
  0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
];

type Read<T> = (x: T) => number;

/** Metric families read from the engine's stats at scrape time. */
interface ScrapedFamilies {
  /** A gauge set to the value read. */
  gauge(name: string, help: string, f: Read<InstanceStatsSnapshot>): void;
  /** A counter mirroring a cumulative stat: it advances by the difference since the last scrape. */
  mirror(name: string, help: string, f: Read<InstanceStatsSnapshot>): void;
}

function scrapedFamilies(reg: Registry, read: () => InstanceStatsSnapshot): ScrapedFamilies {
  // Reading is cheap (counters and sizes), so every collector reads for itself.
  return {
    gauge(name, help, f) {
      new Gauge({
        name,
        help,
        registers: [reg],
        collect() {
          this.set(f(read()));
        },
      });
    },
    mirror(name, help, f) {
      let last = 0;
      new Counter({
        name,
        help,
        registers: [reg],
        collect() {
          const v = f(read());
          if (v > last) this.inc(v - last);
          last = Math.max(last, v);
        },
      });
    },
  };
}

/** Queues, KV pages, zeroing, preemptions, load failures, leases, steps. */
function registerEngineMetrics(f: ScrapedFamilies): void {
  f.gauge('handoff_num_requests_running', 'requests in the running queue', (x) => x.running);
  f.gauge('handoff_num_requests_waiting', 'requests waiting to be scheduled', (x) => x.waiting);
  f.gauge(
    'handoff_num_requests_held_for_send',
    'finished prefill requests whose pages are held for a decode peer',
    (x) => x.heldForSend,
  );
  f.gauge('handoff_kv_cache_usage_perc', 'fraction of KV pages in use (0..1)', (x) => x.kvUsage);
  f.gauge('handoff_kv_free_pages', 'free KV pages (including evictable prefix-cache pages)', (x) => x.freePages);
  f.gauge('handoff_kv_total_pages', 'KV pages in the pool (block 0, the null block, excluded)', (x) => x.totalPages);
  f.mirror('handoff_preemptions_total', 'requests preempted for lack of pages', (x) => x.preemptions);
  f.mirror('handoff_pages_zero_listed_total', 'new pages put on the zeroing list', (x) => x.pagesZeroListed);
  f.mirror('handoff_pages_zeroed_total', 'pages zeroed by the worker', (x) => x.pagesZeroed);
  f.mirror(
    'handoff_pages_tail_zeroed_total',
    'pages a load filled only in part (decode pages larger than prefill pages) whose tail was zeroed once it landed',
    (x) => x.pagesTailZeroed,
  );
  f.mirror(
    'handoff_pages_excluded_from_zeroing_total',
    'READ destination pages removed from the zeroing list',
    (x) => x.pagesExcludedFromZeroing,
  );
  f.mirror('handoff_kv_load_failures_total', 'requests whose KV load failed', (x) => x.kvLoadFailures);
  f.mirror(
    'handoff_leases_expired_total',
    'held prefill pages freed because no release arrived in time',
    (x) => x.leasesExpired,
  );
  f.mirror(
    'handoff_holds_ended_total',
    'held prefill pages freed at once because their answer never reached the client',
    (x) => x.holdsEnded,
  );
  f.mirror('handoff_engine_steps_total', 'engine steps taken', (x) => x.engineSteps);
}

/** The race checker and the lifecycle oracle (--race-check). */
function registerCheckerMetrics(f: ScrapedFamilies): void {
  f.gauge('handoff_race_checker_enabled', '1 when the happens-before race checker runs on this device', (x) =>
    x.races === null ? 0 : 1,
  );
  f.mirror('handoff_races_total', 'unordered conflicting page accesses found by the race checker', (x) => x.races ?? 0);
  f.mirror(
    'handoff_lifecycle_violations_total',
    'page lifecycle invariant violations found by the lifecycle oracle (--race-check)',
    (x) => x.lifecycleViolations ?? 0,
  );
}

/** The transfer engine's counters: metric name, help, TransferStats field. */
const TRANSFER_COUNTERS: ReadonlyArray<readonly [string, string, keyof TransferStats]> = [
  ['handoff_transfer_bytes_read_total', 'bytes pulled by this engine with READs', 'bytesRead'],
  ['handoff_transfer_bytes_written_total', 'bytes pushed by this engine with WRITEs', 'bytesWritten'],
  ['handoff_transfer_reads_total', 'READ work requests posted', 'readsPosted'],
  ['handoff_transfer_read_failures_total', 'READ work requests that failed', 'readsFailed'],
  ['handoff_transfer_writes_total', 'WRITE work requests posted', 'writesPosted'],
  ['handoff_transfer_write_failures_total', 'WRITE work requests that failed', 'writesFailed'],
  ['handoff_transfer_grants_issued_total', 'grants issued for this engine pages', 'grantsIssued'],
  ['handoff_transfer_grants_refused_total', 'READs/WRITEs refused by this engine (GRANT_DENIED)', 'grantsRefused'],
  ['handoff_transfer_grants_expired_total', 'grants that expired unused', 'grantsExpired'],
  [
    'handoff_transfer_releases_refused_total',
    'release/write_done notifications refused (wrong peer or grant token)',
    'releasesRefused',
  ],
  ['handoff_transfer_notifications_failed_total', 'side-channel notifications that failed', 'notificationsFailed'],
  ['handoff_transfer_bad_frames_total', 'data-plane connections closed for malformed frames', 'badFrames'],
  [
    'handoff_transfer_scatter_reads_total',
    'tcp receives (readv) that put payload straight into KV pages',
    'scatterReads',
  ],
  [
    'handoff_transfer_writes_cut_total',
    'WRITEs into this engine stopped mid-payload because their grant was revoked',
    'writesCut',
  ],
];

/** The transfer engine's counters (0 without a connector). */
function registerTransferMetrics(f: ScrapedFamilies): void {
  for (const [name, help, key] of TRANSFER_COUNTERS)
    f.mirror(name, help, (x: InstanceStatsSnapshot): number => (x.transfer ? x.transfer[key] : 0));
}

/** READ latency on the decode side, drained from the engine at scrape time. */
function registerReadLatency(reg: Registry, read: () => InstanceStatsSnapshot): void {
  new Histogram({
    name: 'handoff_kv_read_seconds',
    help: 'time from posting a request’s READs to all of them landed (decode side)',
    buckets: LATENCY_BUCKETS_S,
    registers: [reg],
    collect() {
      for (const ms of read().drainReadLatenciesMs()) this.observe(ms / 1000);
    },
  });
}

function latencyHistogram(reg: Registry, name: string, help: string): Histogram {
  return new Histogram({ name, help, buckets: LATENCY_BUCKETS_S, registers: [reg] });
}

export class InstanceMetrics {
  readonly registry = new Registry();
  private readonly ttft: Histogram;
  private readonly itl: Histogram;
  private readonly e2e: Histogram;
  private readonly finished: Counter<'finish_reason'>;
  private readonly promptTokens: Counter;
  private readonly generationTokens: Counter;
  private readonly httpErrors: Counter<'code'>;
  private readonly prefixQueries: Counter;
  private readonly prefixHits: Counter;
  private readonly processMetrics: { stop(): void };

  constructor(labels: { role: string; model: string }, read: () => InstanceStatsSnapshot) {
    const reg = this.registry;
    reg.setDefaultLabels(labels);
    const families = scrapedFamilies(reg, read);
    registerEngineMetrics(families);
    registerCheckerMetrics(families);
    registerTransferMetrics(families);
    registerReadLatency(reg, read);
    this.processMetrics = registerProcessMetrics(reg);
    this.ttft = latencyHistogram(
      reg,
      'handoff_time_to_first_token_seconds',
      'time from request arrival to its first token',
    );
    this.itl = latencyHistogram(
      reg,
      'handoff_inter_token_latency_seconds',
      'time between consecutive tokens of a request',
    );
    this.e2e = latencyHistogram(
      reg,
      'handoff_e2e_request_latency_seconds',
      'time from arrival to the end of a request',
    );
    this.finished = new Counter({
      name: 'handoff_requests_total',
      help: 'finished requests by finish reason',
      labelNames: ['finish_reason'],
      registers: [reg],
    });
    this.promptTokens = new Counter({
      name: 'handoff_prompt_tokens_total',
      help: 'prompt tokens of finished requests',
      registers: [reg],
    });
    this.generationTokens = new Counter({
      name: 'handoff_generation_tokens_total',
      help: 'tokens generated',
      registers: [reg],
    });
    // Like vLLM's prefix_cache_queries/hits, in tokens, counted where a prompt is computed: a colocated or
    // prefill request, or a decode request served without a remote prefill (not one that loads its KV).
    this.prefixQueries = new Counter({
      name: 'handoff_prefix_cache_queries_total',
      help: 'prompt tokens of requests this instance computed itself, looked up in its prefix cache',
      registers: [reg],
    });
    this.prefixHits = new Counter({
      name: 'handoff_prefix_cache_hits_total',
      help: 'of those, tokens found in its prefix cache (not computed)',
      registers: [reg],
    });
    this.httpErrors = new Counter({
      name: 'handoff_http_errors_total',
      help: 'requests answered with an error, by error code',
      labelNames: ['code'],
      registers: [reg],
    });
  }

  observeTtftMs(ms: number): void {
    this.ttft.observe(ms / 1000);
  }
  observeItlMs(ms: number): void {
    this.itl.observe(ms / 1000);
  }
  observeFinished(reason: string, promptTokens: number, completionTokens: number, e2eMs: number): void {
    this.finished.inc({ finish_reason: reason });
    this.promptTokens.inc(promptTokens);
    this.generationTokens.inc(completionTokens);
    this.e2e.observe(e2eMs / 1000);
  }
  observePrefixCache(queries: number, hits: number): void {
    this.prefixQueries.inc(queries);
    this.prefixHits.inc(hits);
  }
  countError(code: string): void {
    this.httpErrors.inc({ code });
  }

  /** The exposition text (Prometheus text format 0.0.4). */
  async text(): Promise<{ contentType: string; body: string }> {
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }

  /** Stop the process metrics' event-loop sampler (the server is closing). */
  close(): void {
    this.processMetrics.stop();
  }
}
