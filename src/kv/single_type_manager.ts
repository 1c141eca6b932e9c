/**
 * SingleTypeManager: the pages one KV cache group holds per request (vLLM's SingleTypeKVCacheManager).
 *
 *   request r, attention group:  [ local-hit pages | external-computed pages | new pages ... ]
 *                                  touched            fresh from the pool, recorded for zeroing
 *   request r, Mamba group:      [ one running state page ]   never cached, never recorded
 *
 * Recording (`recordsNewBlockIds`) is on iff the cache needs zeroing and the group is an attention
 * group. Prefix-hit pages and the null block are never recorded. The KVCacheManager coordinates the
 * groups; this class does not decide whether an allocation fits.
 */
import { assert } from '../util/assert.ts';
import { extendBlockHashes, type BlockHash } from './block_hash.ts';
import type { BlockPool, KVCacheBlock } from './block_pool.ts';
import type { KVCacheSpec } from './spec.ts';

interface RequestState {
  blocks: KVCacheBlock[];
  /** Hash chain of the request's full blocks, computed as far as needed. */
  hashes: BlockHash[];
  /** Leading blocks already published in (or taken from) the prefix cache. */
  numCachedBlocks: number;
  /** Leading blocks that came from a local prefix hit. */
  numHitBlocks: number;
}

export function cdiv(a: number, b: number): number {
  return Math.ceil(a / b);
}

export class SingleTypeManager {
  readonly blockSize: number;
  readonly isMamba: boolean;
  private readonly requests = new Map<string, RequestState>();
  private newBlockIds: number[] = [];

  constructor(
    readonly groupId: number,
    readonly spec: KVCacheSpec,
    private readonly pool: BlockPool,
    readonly recordsNewBlockIds: boolean,
  ) {
    assert(
      Number.isInteger(spec.blockSize) && spec.blockSize > 0,
      `group ${groupId}: bad block size ${spec.blockSize}`,
    );
    this.blockSize = spec.blockSize;
    this.isMamba = spec.type === 'mamba';
    assert(!(this.isMamba && recordsNewBlockIds), 'Mamba groups never record pages for zeroing');
  }

  hasRequest(requestId: string): boolean {
    return this.requests.has(requestId);
  }

  requestIds(): string[] {
    return [...this.requests.keys()];
  }

  numBlocksOf(requestId: string): number {
    return this.requests.get(requestId)?.blocks.length ?? 0;
  }

  blockIds(requestId: string): number[] {
    return (this.requests.get(requestId)?.blocks ?? []).map((b) => b.blockId);
  }

  /** The prefix hit: cached blocks for the request's first full blocks, at most `maxBlocks`. */
  findLongestCacheHit(tokenIds: readonly number[], maxBlocks: number): KVCacheBlock[] {
    assert(!this.isMamba, 'Mamba groups have no prefix hits');
    const hits: KVCacheBlock[] = [];
    const hashes: BlockHash[] = [];
    for (let i = 0; i < maxBlocks; i++) {
      extendBlockHashes(hashes, tokenIds, this.blockSize, this.groupId, i + 1);
      const block = this.pool.getCachedBlock(hashes[i] as BlockHash);
      if (block === null) break;
      hits.push(block);
    }
    return hits;
  }

  /**
   * Check that `hitIds` are still the cached blocks for this request's first blocks (a scheduler that
   * allocates for other requests between getComputedBlocks and allocateSlots may have evicted them).
   */
  resolveHits(tokenIds: readonly number[], hitIds: readonly number[]): KVCacheBlock[] {
    if (hitIds.length === 0) return [];
    assert(!this.isMamba, 'Mamba groups take no prefix-hit pages');
    const hashes = extendBlockHashes([], tokenIds, this.blockSize, this.groupId, hitIds.length);
    return hitIds.map((id, i) => {
      const block = this.pool.block(id);
      assert(
        block.blockHash === hashes[i],
        () =>
          `group ${this.groupId}: prefix-hit page ${id} no longer holds block ${i} of the prompt (evicted between getComputedBlocks and allocateSlots?)`,
      );
      return block;
    });
  }

  /** Pages this group must take from the pool for the request to hold `numTokens` slots. */
  numBlocksToAllocate(requestId: string, numTokens: number, numHitBlocks: number): number {
    const have = this.numBlocksOf(requestId) + numHitBlocks;
    if (this.isMamba) return have === 0 ? 1 : 0;
    return Math.max(0, cdiv(numTokens, this.blockSize) - have);
  }

  /**
   * Commit step 1: touch and append the prefix-hit pages (creates the request's entry). The manager
   * runs this for every group before any group takes fresh pages, so no fresh page can be a hit page
   * of another group that is still in the free queue.
   */
  saveHits(requestId: string, hits: readonly KVCacheBlock[]): void {
    let state = this.requests.get(requestId);
    if (state === undefined) {
      state = { blocks: [], hashes: [], numCachedBlocks: 0, numHitBlocks: 0 };
      this.requests.set(requestId, state);
    }
    if (hits.length === 0) return;
    assert(state.blocks.length === 0, `group ${this.groupId}: prefix-hit pages only for a request without pages`);
    this.pool.touch(hits);
    state.blocks.push(...hits);
    state.numHitBlocks = hits.length;
    state.numCachedBlocks = hits.length;
  }

  /** Commit step 2: append `numNew` fresh pages from the pool, recorded for zeroing if this group records. */
  allocateNew(requestId: string, numNew: number): KVCacheBlock[] {
    const state = this.requests.get(requestId);
    assert(state !== undefined, `group ${this.groupId}: saveHits must run before allocateNew`);
    const fresh = this.pool.getNewBlocks(numNew);
    state.blocks.push(...fresh);
    if (this.recordsNewBlockIds) for (const b of fresh) this.newBlockIds.push(b.blockId);
    assert(!this.isMamba || state.blocks.length === 1, 'a Mamba group holds exactly one running state page');
    return fresh;
  }

  /**
   * Publish the request's full blocks covering its first `numTokens` tokens in the prefix cache. Returns
   * the pages cached now with their block index (the manager links them to the other groups' pages).
   */
  cacheBlocks(
    requestId: string,
    tokenIds: readonly number[],
    numTokens: number,
  ): Array<{ index: number; block: KVCacheBlock }> {
    const cached: Array<{ index: number; block: KVCacheBlock }> = [];
    if (this.isMamba) return cached;
    const state = this.requests.get(requestId);
    if (state === undefined) return cached;
    const numFull = Math.floor(Math.min(numTokens, tokenIds.length) / this.blockSize);
    assert(
      numFull <= state.blocks.length,
      () => `group ${this.groupId}: ${numFull} full blocks to cache but only ${state.blocks.length} pages`,
    );
    if (numFull <= state.numCachedBlocks) return cached;
    extendBlockHashes(state.hashes, tokenIds, this.blockSize, this.groupId, numFull);
    let runStart = -1; // first block of the current run of hashes new to the pool (one BlockStored each)
    for (let i = state.numCachedBlocks; i < numFull; i++) {
      const block = state.blocks[i] as KVCacheBlock;
      const hash = state.hashes[i] as BlockHash;
      let added = false;
      const parent = i === 0 ? null : (state.blocks[i - 1] as KVCacheBlock);
      if (block.blockHash === null) {
        added = this.pool.cacheBlock(block, hash, parent);
        cached.push({ index: i, block });
      } else
        assert(
          block.blockHash === hash,
          () => `group ${this.groupId}: page ${block.blockId} cached under another prefix`,
        );
      if (added && runStart < 0) runStart = i;
      if (!added && runStart >= 0) {
        this.publishStored(state.hashes, tokenIds, runStart, i);
        runStart = -1;
      }
    }
    if (runStart >= 0) this.publishStored(state.hashes, tokenIds, runStart, numFull);
    state.numCachedBlocks = numFull;
    return cached;
  }

  /** The request's page holding token `token`, if it holds one and it is cached; else null. */
  cachedBlockAt(requestId: string, token: number): KVCacheBlock | null {
    const block = this.requests.get(requestId)?.blocks[Math.floor(token / this.blockSize)];
    return block !== undefined && block.blockHash !== null ? block : null;
  }

  /** BlockStored for blocks [from, to) of a request's chain. */
  private publishStored(hashes: readonly BlockHash[], tokenIds: readonly number[], from: number, to: number): void {
    if (!this.pool.publishing) return;
    this.pool.publishStored({
      block_hashes: hashes.slice(from, to),
      parent_block_hash: from === 0 ? null : (hashes[from - 1] as BlockHash),
      token_ids: tokenIds.slice(from * this.blockSize, to * this.blockSize),
      block_size: this.blockSize,
      group_idx: this.groupId,
    });
  }

  /**
   * Withdraw the request's pages from token `startToken` on from the prefix cache; returns their ids and
   * those of the cached pages computed over them that were withdrawn with them (BlockPool.uncache).
   */
  uncacheFrom(requestId: string, startToken: number): number[] {
    const state = this.requests.get(requestId);
    if (state === undefined || this.isMamba) return [];
    const from = Math.floor(startToken / this.blockSize);
    const blocks = state.blocks.slice(from);
    const withdrawn = blocks.map((b) => b.blockId);
    for (const b of blocks) if (b.blockHash !== null) withdrawn.push(...this.pool.uncache(b));
    state.numCachedBlocks = Math.min(state.numCachedBlocks, from);
    return withdrawn;
  }

  /**
   * Remove the request and hand back its pages in allocation order, still referenced. Its pages that no
   * other request holds leave the list recorded for zeroing: they are not this request's to zero any more
   * (the next owner records them again), and a zero op must never be queued for a page the instance no
   * longer owns (I6). A page another request holds (its prefix hit on a page taken new this step) stays
   * on the list: it is still new to that owner.
   */
  detach(requestId: string): KVCacheBlock[] {
    const state = this.requests.get(requestId);
    if (state === undefined) return [];
    this.requests.delete(requestId);
    if (this.newBlockIds.length > 0) {
      const leaving = new Set(state.blocks.filter((b) => b.refCnt <= 1).map((b) => b.blockId));
      this.newBlockIds = this.newBlockIds.filter((b) => !leaving.has(b));
    }
    return state.blocks;
  }

  takeNewBlockIds(): number[] {
    const out = this.newBlockIds;
    this.newBlockIds = [];
    return out;
  }

  /** The request's pages [floor(start/bs), cdiv(end, bs)), clipped to the pages it holds. */
  blockIdsInRange(requestId: string, startToken: number, endToken: number): number[] {
    assert(
      Number.isInteger(startToken) && startToken >= 0 && endToken >= startToken,
      `bad token range [${startToken}, ${endToken})`,
    );
    const blocks = this.requests.get(requestId)?.blocks ?? [];
    return blocks.slice(Math.floor(startToken / this.blockSize), cdiv(endToken, this.blockSize)).map((b) => b.blockId);
  }

  /** Record again the request's pages from token `startToken` on (e.g. after a failed async load). */
  rerecordFrom(requestId: string, startToken: number): void {
    assert(this.recordsNewBlockIds, 'only recording groups re-record pages');
    assert(
      Number.isInteger(startToken) && startToken >= 0 && startToken % this.blockSize === 0,
      `group ${this.groupId}: start token ${startToken} is not block aligned`,
    );
    const state = this.requests.get(requestId);
    if (state === undefined) return;
    const from = startToken / this.blockSize;
    // Invariant: a prefix-hit page is shared, published KV; zeroing it would corrupt every holder.
    assert(
      from >= state.numHitBlocks,
      () => `group ${this.groupId}: re-recording from block ${from} would zero prefix-hit pages`,
    );
    for (const b of state.blocks.slice(from)) this.newBlockIds.push(b.blockId);
  }
}
