/**
 * KvRouter: where one request goes, decode first (like llm-d):
 *
 *   1. decode  = argmax over healthy decodes of  score = kvWeight × hit/prompt − load
 *   2. if that decode already holds the prompt's prefix (hit > 0) and the uncached rest is at most
 *      `skipPrefillMaxTokens`, no remote prefill: decode computes the rest itself, like a colocated
 *      instance (llm-d's prefix-based P/D decider)
 *   3. else prefill = argmax over healthy prefills of the same score
 *
 *   hit  = leading prompt blocks the RouterIndex says the instance holds, in tokens: the instance's own
 *          hashes (kv/block_hash.ts: its block size, every prefix-cached group, the shortest run of them),
 *          capped like the instance's own lookup (the last prompt token is always computed)
 *   load = max(requests in flight through this router, running + waiting it last reported)
 *          + pages it holds for a peer, counted in requests of this request's size
 *
 * Ties go round robin. The index only steers: an instance always checks its own cache, so a stale index
 * costs compute, never correctness. Policies `round-robin` and `least-loaded` ignore the index.
 */
import { assert } from '../util/assert.ts';
import { hashBlockTokens, type BlockHash } from '../kv/block_hash.ts';
import { isBlockSize } from '../kv/presets.ts';
import type { InstancePool, PoolMember } from './instance_pool.ts';
import type { RouterIndex } from './router_index.ts';
import { pairedOnly } from './pool_pairing.ts';

export interface KvRouterOptions {
  /** What a full-prompt hit is worth, in requests of load. */
  kvWeight: number;
  /** Skip the remote prefill when decode's uncached rest of the prompt is at most this many tokens. */
  skipPrefillMaxTokens: number;
}

export const DEFAULT_KV_ROUTER_OPTIONS: KvRouterOptions = { kvWeight: 4, skipPrefillMaxTokens: 128 };

export interface RouteDecision {
  decode: PoolMember;
  /** null: decode computes the prompt itself (its cache holds the prefix). */
  prefill: PoolMember | null;
  decodeHitTokens: number;
  prefillHitTokens: number;
}

/** Hash chains of one prompt, per (block size, group), computed only as far as some instance matches. */
export class PromptChains {
  private readonly chains = new Map<string, BlockHash[]>();

  constructor(readonly tokenIds: readonly number[]) {}

  /** Hash of block `i` (0-based) at `blockSize` in `group`. */
  hash(blockSize: number, group: number, i: number): BlockHash {
    const key = `${blockSize}:${group}`;
    let chain = this.chains.get(key);
    if (chain === undefined) {
      chain = [];
      this.chains.set(key, chain);
    }
    for (let k = chain.length; k <= i; k++) {
      const toks = this.tokenIds.slice(k * blockSize, (k + 1) * blockSize);
      assert(toks.length === blockSize, 'hash of a block past the prompt');
      chain.push(hashBlockTokens(k === 0 ? null : (chain[k - 1] as BlockHash), toks, group));
    }
    return chain[i] as BlockHash;
  }
}

const isGroupId = (g: unknown): boolean => Number.isInteger(g) && (g as number) >= 0 && (g as number) <= 0xffff_ffff;

/** Tokens of the prompt the index says `m` holds (0 without /handoff/info or prefix caching). */
export function hitTokensOf(index: RouterIndex, m: PoolMember, chains: PromptChains): number {
  const info = m.info;
  // The health check validated the info (instance_info.ts); checked again here, where it reaches the hasher.
  if (info === null || !isBlockSize(info.block_size) || !Array.isArray(info.prefix_cache_groups)) return 0;
  if (info.prefix_cache_groups.length === 0 || !info.prefix_cache_groups.every(isGroupId)) return 0;
  const bs = info.block_size;
  const maxBlocks = Math.floor((chains.tokenIds.length - 1) / bs);
  const held = index.hashesOf(m.url);
  if (held.size === 0) return 0;
  let blocks = maxBlocks;
  for (const g of info.prefix_cache_groups) {
    let n = 0;
    while (n < blocks && held.has(chains.hash(bs, g, n))) n++;
    blocks = n;
  }
  return blocks * bs;
}

/** The router's load of `m`, in requests (see the module comment). */
export function loadOf(m: PoolMember, promptTokens: number): number {
  const reported = m.load;
  const queued = Math.max(m.inflight, reported ? reported.running + reported.waiting : 0);
  if (reported === null || reported.held_for_send_pages === 0) return queued;
  const groups = Math.max(1, m.info?.prefix_cache_groups.length ?? 1);
  const pagesPerRequest = Math.max(1, Math.ceil(promptTokens / Math.max(1, m.info?.block_size ?? 16)) * groups);
  return queued + reported.held_for_send_pages / pagesPerRequest;
}

export function scoreOf(hitTokens: number, promptTokens: number, load: number, kvWeight: number): number {
  return (kvWeight * hitTokens) / Math.max(1, promptTokens) - load;
}

export class KvRouter {
  private readonly turn = new Map<string, number>();
  stats = { routed: 0, skippedPrefill: 0 };

  constructor(
    private readonly index: RouterIndex,
    private readonly opts: KvRouterOptions = DEFAULT_KV_ROUTER_OPTIONS,
  ) {
    assert(opts.kvWeight >= 0 && opts.skipPrefillMaxTokens >= 0, 'router weights are non-negative');
  }

  /** Decode first, then (unless skipped) prefill; null when a side has no healthy member left. */
  route(
    pools: { prefill: InstancePool; decode: InstancePool },
    tokenIds: readonly number[],
    exclude: ReadonlySet<PoolMember> = new Set(),
  ): RouteDecision | null {
    const chains = new PromptChains(tokenIds);
    const d = this.best(pools.decode, chains, exclude);
    if (d === null) return null;
    this.stats.routed++;
    const uncached = tokenIds.length - d.hit;
    if (d.hit > 0 && uncached <= this.opts.skipPrefillMaxTokens) {
      this.stats.skippedPrefill++;
      return { decode: d.m, prefill: null, decodeHitTokens: d.hit, prefillHitTokens: 0 };
    }
    const p = this.best(pools.prefill, chains, pairedOnly(pools.prefill, d.m, exclude));
    if (p === null) return null;
    return { decode: d.m, prefill: p.m, decodeHitTokens: d.hit, prefillHitTokens: p.hit };
  }

  private best(
    pool: InstancePool,
    chains: PromptChains,
    exclude: ReadonlySet<PoolMember>,
  ): { m: PoolMember; hit: number } | null {
    const n = pool.members.length;
    const start = this.turn.get(pool.side) ?? 0;
    let best: { m: PoolMember; hit: number; score: number; i: number } | null = null;
    for (let k = 0; k < n; k++) {
      const i = (start + k) % n;
      const m = pool.members[i] as PoolMember;
      if (!m.healthy || exclude.has(m)) continue;
      const hit = hitTokensOf(this.index, m, chains);
      const score = scoreOf(hit, chains.tokenIds.length, loadOf(m, chains.tokenIds.length), this.opts.kvWeight);
      if (best === null || score > best.score) best = { m, hit, score, i };
    }
    if (best === null) return null;
    this.turn.set(pool.side, (best.i + 1) % n);
    return { m: best.m, hit: best.hit };
  }
}

/** Whether two members (of either pool) are one instance: the same URL, or the same engine behind two URLs. */
export function sameInstance(a: PoolMember, b: PoolMember): boolean {
  const engine = a.info?.engine_id ?? null;
  return a.url === b.url || (engine !== null && engine === (b.info?.engine_id ?? null));
}

/**
 * A kv_both instance may sit in both pools, but it cannot load KV from itself (the handshake refuses its own
 * engine id): the prefill leg goes to another instance, or there is none and the instance computes the
 * prompt itself (decode-only). Before, both legs went to it and the request failed with a 400.
 */
export function legsApart(
  route: RouteDecision,
  prefill: InstancePool,
  exclude: ReadonlySet<PoolMember>,
): RouteDecision {
  if (route.prefill === null || !sameInstance(route.prefill, route.decode)) return route;
  const self = prefill.members.filter((m) => sameInstance(m, route.decode));
  const other = prefill.pick(new Set([...pairedOnly(prefill, route.decode, exclude), ...self]));
  return { ...route, prefill: other, prefillHitTokens: 0 };
}
