/**
 * KVCacheManager: one SingleTypeManager per KV cache group over one shared BlockPool (vLLM's
 * KVCacheManager + coordinator). The scheduler (src/engine) is its only caller.
 *
 *   allocateSlots(req, numNew, {hits, external, lookahead}) per group:
 *     [ local-hit pages (touched) | external-computed pages | new pages for numNew + lookahead ]
 *     all-or-nothing: either every group gets its pages or nothing changes (null).
 *
 * Pages recorded for zeroing (takeNewBlockIds): every page taken fresh from the pool by an attention
 * group, only when config.needsKvCacheZeroing. Never prefix-hit pages, Mamba pages or the null block.
 *
 * Ownership: a page is held by the requests whose lists contain it (refCnt = number of holders; a page
 * is shared only through a prefix hit). detach() hands a request's pages to the caller still held; the
 * scheduler's deferred-free fence returns them later with freeBlockIds().
 */
import { assert, defined } from '../util/assert.ts';
import { BlockPool, type KVCacheBlock } from './block_pool.ts';
import { KvEventPublisher, type KvEventPublisherOptions } from './kv_events.ts';
import { SingleTypeManager } from './single_type_manager.ts';
import { isAttentionSpec, type KVCacheConfig } from './spec.ts';

/** Block ids per group, in group order. */
export type BlockIds = number[][];

/** What the manager needs of a request. The scheduler's Request satisfies it structurally. */
export interface RequestTokens {
  requestId: string;
  /** All tokens so far (prompt + output). */
  readonly tokenIds: readonly number[];
  /**
   * Tokens already computed before this scheduling step (vLLM's request.num_computed_tokens), not
   * counting this call's hits/external tokens. Needed by allocateSlots once the request holds pages;
   * a request without pages has computed nothing.
   */
  numComputedTokens?: number;
}

export interface AllocateSlotsOptions {
  /** Tokens covered by the local prefix hit (from getComputedBlocks). */
  numNewComputedTokens?: number;
  /** The local prefix hit's pages per group (from getComputedBlocks). */
  newComputedBlocks?: BlockIds;
  /** Extra slots reserved beyond the new tokens (speculative decoding). */
  numLookaheadTokens?: number;
  /** Tokens a connector will load into pages allocated now. */
  numExternalComputedTokens?: number;
  /** Do not publish blocks now (an async load has not landed yet); call cacheBlocks later. */
  delayCacheBlocks?: boolean;
}

function gcd(a: number, b: number): number {
  return b === 0 ? a : gcd(b, a % b);
}

function isCount(n: number): boolean {
  return Number.isInteger(n) && n >= 0;
}

export class KVCacheManager {
  readonly numGroups: number;
  private readonly pool: BlockPool;
  /** Oracles hearing of pages given back to zeroing by a rolled-back load (observeRerecords). */
  private rerecordObservers: ReadonlyArray<(blockIds: number[]) => void> = [];
  private readonly managers: SingleTypeManager[];
  /** Prefix hits are used and published only without Mamba groups (their state page is not a prefix). */
  private readonly cachingActive: boolean;

  constructor(
    readonly config: KVCacheConfig,
    opts: { enableCaching: boolean },
  ) {
    this.numGroups = config.groups.length;
    assert(this.numGroups > 0, 'a KV cache manager needs at least one group');
    this.pool = new BlockPool(config.numBlocks, opts.enableCaching);
    this.managers = config.groups.map((g, i) => {
      assert(g.groupId === i, `group ids must be 0..n-1 in order (got ${g.groupId} at ${i})`);
      const records = config.needsKvCacheZeroing && isAttentionSpec(g.spec);
      return new SingleTypeManager(g.groupId, g.spec, this.pool, records);
    });
    this.cachingActive = opts.enableCaching && !this.managers.some((m) => m.isMamba);
  }

  /**
   * The local prefix hit: full cached blocks only, never the whole prompt (the last token is always
   * computed), the same number of tokens in every group. Touches nothing.
   */
  getComputedBlocks(req: RequestTokens): { blocks: BlockIds; numComputedTokens: number } {
    const none = { blocks: this.managers.map(() => []), numComputedTokens: 0 };
    if (!this.cachingActive) return none;
    const hitsPerGroup = this.managers.map((m) =>
      m.findLongestCacheHit(req.tokenIds, Math.max(0, Math.floor((req.tokenIds.length - 1) / m.blockSize))),
    );
    // A hit must be whole blocks in every group: round the common length down to the lcm of block sizes.
    const lcm = this.managers.reduce((acc, m) => (acc * m.blockSize) / gcd(acc, m.blockSize), 1);
    const minTokens = Math.min(
      ...hitsPerGroup.map((h, g) => h.length * defined(this.managers[g], 'manager').blockSize),
    );
    const numComputedTokens = Math.floor(minTokens / lcm) * lcm;
    const blocks = hitsPerGroup.map((h, g) =>
      h.slice(0, numComputedTokens / defined(this.managers[g], 'manager').blockSize).map((b) => b.blockId),
    );
    return { blocks, numComputedTokens };
  }

  /**
   * Give the request the pages it needs for numNewTokens (+ lookahead) after its computed, hit and
   * external tokens. Returns the ids of every page this call added per group (hit, external and new
   * pages; for a request's first call that equals getBlockIds), or null when the pool is short, in
   * which case nothing changed.
   */
  allocateSlots(req: RequestTokens, numNewTokens: number, opts: AllocateSlotsOptions = {}): BlockIds | null {
    const numNewComputed = opts.numNewComputedTokens ?? 0;
    const numExternal = opts.numExternalComputedTokens ?? 0;
    const numLookahead = opts.numLookaheadTokens ?? 0;
    const hitIds = opts.newComputedBlocks ?? this.managers.map(() => []);
    assert(
      isCount(numNewTokens) && isCount(numNewComputed) && isCount(numExternal) && isCount(numLookahead),
      () =>
        `allocateSlots: bad counts new=${numNewTokens} hit=${numNewComputed} external=${numExternal} lookahead=${numLookahead}`,
    );
    assert(hitIds.length === this.numGroups, `newComputedBlocks needs one list per group (${this.numGroups})`);
    const holds = this.managers.some((m) => m.hasRequest(req.requestId));
    const numComputedBefore = holds
      ? defined(req.numComputedTokens, `numComputedTokens of request ${req.requestId}, which already holds pages`)
      : (req.numComputedTokens ?? 0);
    assert(
      holds || numComputedBefore === 0,
      () => `request ${req.requestId} has ${numComputedBefore} computed tokens but no pages`,
    );
    const totalComputed = numComputedBefore + numNewComputed + numExternal;
    const numTokensNeedSlot = totalComputed + numNewTokens + numLookahead;

    // Plan every group before touching the pool, so a shortfall changes nothing.
    let needed = 0;
    const plans = this.managers.map((m, g) => {
      const hits = hitIds[g] as number[];
      if (hits.length > 0) {
        assert(this.cachingActive, 'prefix-hit pages passed with prefix caching off');
        assert(!holds, () => `request ${req.requestId} already holds pages; prefix hits are for its first allocation`);
      }
      if (!m.isMamba) {
        assert(
          numNewComputed === hits.length * m.blockSize,
          () => `group ${g}: ${hits.length} hit pages do not cover ${numNewComputed} hit tokens`,
        );
        // Invariant: computed tokens already have pages.
        assert(
          numComputedBefore <= m.numBlocksOf(req.requestId) * m.blockSize,
          () => `group ${g}: ${numComputedBefore} computed tokens exceed the request's pages`,
        );
      }
      const blocks = m.resolveHits(req.tokenIds, hits);
      const numNew = m.numBlocksToAllocate(req.requestId, numTokensNeedSlot, blocks.length);
      needed += numNew + blocks.filter((b) => b.refCnt === 0).length; // touching a free hit takes it off the queue
      return { blocks, numNew };
    });
    if (needed > this.pool.getNumFreeBlocks()) return null;

    // Every group's hits are touched before any group pops fresh pages: a free hit page must leave the
    // queue before it could be popped (and evicted) as another group's fresh page.
    const planOf = (g: number) => plans[g] as { blocks: KVCacheBlock[]; numNew: number };
    this.managers.forEach((m, g) => m.saveHits(req.requestId, planOf(g).blocks));
    const added = this.managers.map((m, g) => {
      const fresh = m.allocateNew(req.requestId, planOf(g).numNew);
      return [...planOf(g).blocks, ...fresh].map((b) => b.blockId);
    });
    if (!opts.delayCacheBlocks) this.cacheBlocks(req, Math.min(totalComputed + numNewTokens, req.tokenIds.length));
    return added;
  }

  /** Publish the request's full blocks within its first numComputedTokens tokens. */
  cacheBlocks(req: RequestTokens, numComputedTokens: number): void {
    assert(isCount(numComputedTokens), `bad numComputedTokens ${numComputedTokens}`);
    if (!this.cachingActive) return;
    const cached = this.managers.map((m) => m.cacheBlocks(req.requestId, req.tokenIds, numComputedTokens));
    if (this.numGroups === 1) return;
    // A forward computes every layer: a page's KV was computed over the KV of the tokens before it in every
    // group, so withdrawing any of those pages must withdraw it too (each group links its own; these the rest).
    cached.forEach((pages, g) => {
      const blockSize = defined(this.managers[g], 'manager').blockSize;
      const others = this.managers.filter((_, h) => h !== g);
      for (const { index, block } of pages)
        for (const other of index === 0 ? [] : others) {
          const parent = other.cachedBlockAt(req.requestId, index * blockSize - 1);
          if (parent !== null) this.pool.link(block, parent);
        }
    });
  }

  /**
   * The request's KV from token `startToken` on is not valid (its forward failed): withdraw those pages
   * from the prefix cache. Returns the other requests that already share any of them (they hit them).
   */
  uncacheFrom(requestId: string, startToken: number): string[] {
    return this.holdersOf(new Set(this.managers.flatMap((m) => m.uncacheFrom(requestId, startToken))), requestId);
  }

  /**
   * Pages whose KV was never computed, of a request that no longer holds them (it left while the step
   * writing them ran; the fence still holds them): withdraw them from the prefix cache. Returns the
   * requests that hit any of them.
   */
  uncacheBlockIds(blockIds: readonly number[]): string[] {
    const withdrawn = new Set(blockIds);
    for (const id of blockIds) {
      const block = this.pool.block(id);
      if (block.blockHash !== null) for (const w of this.pool.uncache(block)) withdrawn.add(w);
    }
    return this.holdersOf(withdrawn, null);
  }

  private holdersOf(withdrawn: ReadonlySet<number>, requestId: string | null): string[] {
    const holders = new Set<string>();
    for (const m of this.managers) {
      for (const other of m.requestIds())
        if (other !== requestId && m.blockIds(other).some((b) => withdrawn.has(b))) holders.add(other);
    }
    return [...holders];
  }

  /** The request's pages from token `startToken` on, in the prefix-cached groups (what a step writes). */
  cachedGroupBlockIdsFrom(requestId: string, startToken: number): number[] {
    if (!this.cachingActive) return [];
    return this.managers.flatMap((m) => m.blockIdsInRange(requestId, startToken, Number.MAX_SAFE_INTEGER));
  }

  getBlockIds(requestId: string): BlockIds {
    return this.managers.map((m) => m.blockIds(requestId));
  }

  /** Forget the request and return its pages per group, still held (refCnt unchanged). */
  detach(requestId: string): BlockIds {
    return this.managers.map((m) => m.detach(requestId).map((b) => b.blockId));
  }

  /** Return detached pages to the pool: each group's list is freed in reverse, so its tail is reused first. */
  freeBlockIds(blocks: BlockIds): void {
    assert(blocks.length === this.numGroups, `freeBlockIds needs one list per group (${this.numGroups})`);
    for (const ids of blocks) this.pool.freeBlocks([...ids].reverse().map((id) => this.pool.block(id)));
  }

  free(requestId: string): void {
    this.freeBlockIds(this.detach(requestId));
  }

  /** Drain the pages recorded for zeroing: group order, then allocation order, duplicates kept. */
  takeNewBlockIds(): number[] {
    return this.managers.flatMap((m) => m.takeNewBlockIds());
  }

  /** Recording groups' pages of the request covering tokens [startToken, endToken). */
  getZeroingBlockIdsInRange(requestId: string, startToken: number, endToken: number): number[] {
    return this.managers
      .filter((m) => m.recordsNewBlockIds)
      .flatMap((m) => m.blockIdsInRange(requestId, startToken, endToken));
  }

  /** Record the request's pages from startToken (block aligned) on for zeroing again. */
  recordBlocksForZeroing(requestId: string, startToken: number): void {
    if (this.rerecordObservers.length > 0) {
      const ids = this.getZeroingBlockIdsInRange(requestId, startToken, Number.MAX_SAFE_INTEGER);
      for (const o of this.rerecordObservers) o(ids);
    }
    for (const m of this.managers) if (m.recordsNewBlockIds) m.rerecordFrom(requestId, startToken);
  }

  /** Oracles: hear of pages recorded for zeroing again (a load rolled back); returns the unsubscribe. */
  observeRerecords(o: (blockIds: number[]) => void): () => void {
    this.rerecordObservers = [...this.rerecordObservers, o];
    return () => void (this.rerecordObservers = this.rerecordObservers.filter((x) => x !== o));
  }

  getNumFreeBlocks(): number {
    return this.pool.getNumFreeBlocks();
  }

  usage(): number {
    return this.pool.usage();
  }

  numRequests(): number {
    const ids = new Set<string>();
    for (const m of this.managers) for (const id of m.requestIds()) ids.add(id);
    return ids.size;
  }

  resetPrefixCache(): boolean {
    return this.pool.resetPrefixCache();
  }

  /** Groups whose pages are prefix-cached (and so named by KV events): none with caching off or Mamba. */
  prefixCacheGroups(): number[] {
    return this.cachingActive ? this.managers.map((m) => m.groupId) : [];
  }

  /**
   * Publish the pool's KV events (kv_events.ts) to a new publisher; called once, before anything is
   * cached. Prefix caching off (or a Mamba group) means no event is ever emitted.
   */
  publishKvEvents(opts: Omit<KvEventPublisherOptions, 'snapshot'>): KvEventPublisher {
    const publisher = new KvEventPublisher({ ...opts, snapshot: () => this.pool.cachedHashes() });
    this.pool.publishEvents(publisher);
    return publisher;
  }

  /** The shared pool, read-only use: oracles and tests (refCnt, free queue, verify()). */
  get blockPool(): BlockPool {
    return this.pool;
  }
}
