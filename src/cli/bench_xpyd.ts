/**
 * `handoff bench serve --target xpyd`: the same seeded workload against N prefill + M decode instances
 * once per routing policy (default kv-aware, then round-robin), each on a freshly started deployment
 * (cold caches, same start for every policy), in one run. Besides the bench's latencies it reports:
 *
 *   prefix hit rate   Σ handoff_prefix_cache_hits_total / Σ handoff_prefix_cache_queries_total over every
 *                     instance during the run: of the prompt tokens some instance had to compute (a
 *                     prefill leg, or a decode serving without a remote prefill), the share its prefix
 *                     cache already held
 *   decode-only       requests the router sent to a decode holding the prefix, without a remote prefill
 */
import type { Env } from '../util/env.ts';
import { createLogger } from '../util/log.ts';
import type { ModelPreset } from '../kv/presets.ts';
import type { RoutingPolicy } from '../serve/instance_pool.ts';
import type { KvRouterOptions } from '../serve/kv_router.ts';
import type { BenchServeResult } from '../serve/load_generator.ts';
import { startLocalCluster } from './cluster.ts';

export interface XpydBench {
  preset: ModelPreset;
  mode: 'read' | 'write';
  numBlocks: string;
  /** Each instance's --max-model-len (room for the workload's longest request). */
  maxModelLen: string;
  apiKey: string | null;
  numPrefill: number;
  numDecode: number;
  policies: RoutingPolicy[];
  router: KvRouterOptions;
}

export interface XpydRow {
  label: string;
  r: BenchServeResult;
  prefixHitRate: number;
  decodeOnly: number;
}

/** Σ of the prefix-cache counters over `urls` (their /metrics). */
export async function prefixCounters(
  urls: string[],
  apiKey: string | null,
): Promise<{ hits: number; queries: number }> {
  let hits = 0;
  let queries = 0;
  for (const url of urls) {
    const headers: Record<string, string> = apiKey ? { authorization: `Bearer ${apiKey}` } : {};
    const text = await (await fetch(`${url}/metrics`, { headers })).text();
    const read = (name: string): number =>
      Number(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'm').exec(text)?.[1] ?? 0);
    hits += read('handoff_prefix_cache_hits_total');
    queries += read('handoff_prefix_cache_queries_total');
  }
  return { hits, queries };
}

/**
 * One fresh deployment per policy; `run` sends the workload to its proxy URL. Once `stop` (Ctrl-C) fired,
 * no further deployment starts: the rows are those run so far.
 */
export async function runXpyd(
  b: XpydBench,
  env: Env,
  run: (url: string, label: string) => Promise<BenchServeResult>,
  stop?: AbortSignal,
): Promise<XpydRow[]> {
  const logLevel = process.env['HANDOFF_LOG_LEVEL'] ?? 'warn';
  const rows: XpydRow[] = [];
  for (const policy of b.policies) {
    if (rows.length > 0 && stop?.aborted === true) break;
    const cluster = await startLocalCluster(
      {
        preset: b.preset,
        mode: b.mode,
        host: '127.0.0.1',
        proxyPort: 0,
        serveArgs: ['--num-blocks', b.numBlocks, '--max-model-len', b.maxModelLen],
        apiKey: b.apiKey,
        numPrefill: b.numPrefill,
        numDecode: b.numDecode,
        policy,
        router: b.router,
        log: createLogger('bench', logLevel),
        childLogLevel: logLevel,
      },
      env,
    );
    try {
      const urls = [...cluster.prefills, ...cluster.decodes].map((c) => c.url);
      const before = await prefixCounters(urls, b.apiKey);
      const r = await run(cluster.proxyUrl, policy);
      const after = await prefixCounters(urls, b.apiKey);
      const queries = after.queries - before.queries;
      const prefixHitRate = queries > 0 ? (after.hits - before.hits) / queries : 0;
      rows.push({ label: policy, r, prefixHitRate, decodeOnly: cluster.proxy.router.stats.skippedPrefill });
    } finally {
      await cluster.stop();
    }
  }
  return rows;
}
