/**
 * BlockPool: the pages of the KV cache, shared by every group (vLLM v1 semantics, our code).
 *
 *   blocks:     [0 null] [1] [2] ... [numBlocks-1]        block 0 is taken at init, never handed out or freed
 *   free queue: head <-> b <-> b <-> ... <-> b <-> tail   refCnt == 0, LRU order: pop at head, free to tail
 *   cache map:  hash -> {blockId -> block}                full blocks published for prefix hits
 *
 * A free block may still carry its hash: it stays a prefix-cache hit until it is popped for reuse, which
 * evicts it from the map (getNewBlocks). A hit on a free block removes it from the queue (touch).
 *
 * Invariants (checked by verify()): a block is in the free queue iff refCnt == 0 and it is not the
 * null block; refCnt >= 0; a block with a hash is in the map under that hash and vice versa.
 *
 * Observers (`observe`, for oracles) hear of pages leaving and re-entering the free queue; with none
 * the cost is one null check per call.
 *
 * KV events (kv_events.ts, set semantics): `BlockRemoved` when the last page holding a hash leaves the
 * cache map, `AllBlocksCleared` on a reset; `BlockStored` is published by the caller that cached the
 * pages (it knows their tokens) through publishStored, for the hashes cacheBlock reported as new.
 */
import { assert } from '../util/assert.ts';
import type { BlockHash } from './block_hash.ts';
import { MEDIUM_GPU, type BlockStored, type KvEventSink } from './kv_events.ts';

export class KVCacheBlock {
  refCnt = 0;
  blockHash: BlockHash | null = null;
  /**
   * While cached: the pages its KV was computed attending over (the request's pages of the block before,
   * in its own group and in every other group: a forward computes every layer), and the cached pages
   * computed over this one. Withdrawing a page withdraws its `kids` (uncache); reusing it only unlinks
   * them (the KV they hold was computed over valid KV).
   */
  parents: Set<KVCacheBlock> | null = null;
  kids: Set<KVCacheBlock> | null = null;
  /** Intrusive links of the free queue (null when not queued). */
  prevFree: KVCacheBlock | null = null;
  nextFree: KVCacheBlock | null = null;

  constructor(
    readonly blockId: number,
    readonly isNull: boolean,
  ) {}
}

/** Doubly linked LRU list of free blocks with O(1) removal from the middle (a prefix hit). */
class FreeBlockQueue {
  private readonly head = new KVCacheBlock(-1, false);
  private readonly tail = new KVCacheBlock(-2, false);
  length = 0;

  constructor() {
    this.head.nextFree = this.tail;
    this.tail.prevFree = this.head;
  }

  isQueued(block: KVCacheBlock): boolean {
    return block.prevFree !== null;
  }

  append(block: KVCacheBlock): void {
    assert(!this.isQueued(block), () => `block ${block.blockId} is already in the free queue`);
    const last = this.tail.prevFree as KVCacheBlock;
    last.nextFree = block;
    block.prevFree = last;
    block.nextFree = this.tail;
    this.tail.prevFree = block;
    this.length++;
  }

  popLeft(): KVCacheBlock {
    const first = this.head.nextFree as KVCacheBlock;
    assert(first !== this.tail, 'pop from an empty free queue');
    this.remove(first);
    return first;
  }

  remove(block: KVCacheBlock): void {
    const prev = block.prevFree;
    const next = block.nextFree;
    assert(prev !== null && next !== null, () => `block ${block.blockId} is not in the free queue`);
    prev.nextFree = next;
    next.prevFree = prev;
    block.prevFree = null;
    block.nextFree = null;
    this.length--;
  }

  /** Blocks from head (evicted first) to tail. Bounded by `length`: a broken link cannot loop forever. */
  toArray(): KVCacheBlock[] {
    const out: KVCacheBlock[] = [];
    let cur = this.head.nextFree;
    while (cur !== null && cur !== this.tail) {
      assert(out.length < this.length, 'free queue is longer than its length (cycle?)');
      assert(cur.nextFree === null || cur.nextFree.prevFree === cur, 'free queue links are inconsistent');
      out.push(cur);
      cur = cur.nextFree;
    }
    assert(out.length === this.length, () => `free queue walk found ${out.length} blocks, length says ${this.length}`);
    return out;
  }
}

/** Watches pages move between the free queue and their owners. Called synchronously, after the change. */
export interface BlockPoolObserver {
  /** Popped by getNewBlocks: they hold their previous owner's bytes. */
  allocated(blockIds: readonly number[]): void;
  /** Free pages taken back by a prefix hit (touch): they keep their KV. */
  revived(blockIds: readonly number[]): void;
  /** Their last reference was dropped (freeBlocks): back in the free queue. */
  freed(blockIds: readonly number[]): void;
}

export class BlockPool {
  readonly nullBlock: KVCacheBlock;
  private readonly blocks: KVCacheBlock[];
  private readonly freeQueue = new FreeBlockQueue();
  private readonly cached = new Map<BlockHash, Map<number, KVCacheBlock>>();
  /** Copy-on-write list; null when nobody observes. */
  private observers: readonly BlockPoolObserver[] | null = null;
  private events: KvEventSink | null = null;

  constructor(
    readonly numBlocks: number,
    readonly enableCaching: boolean,
  ) {
    assert(
      Number.isInteger(numBlocks) && numBlocks >= 2,
      `a pool needs at least the null block and one page, got ${numBlocks}`,
    );
    this.blocks = Array.from({ length: numBlocks }, (_, id) => new KVCacheBlock(id, id === 0));
    for (const b of this.blocks) if (!b.isNull) this.freeQueue.append(b);
    this.nullBlock = this.blocks[0] as KVCacheBlock;
    // The null block pads block tables; it is held forever so it is never popped or freed.
    this.nullBlock.refCnt = 1;
  }

  block(blockId: number): KVCacheBlock {
    assert(Number.isInteger(blockId) && blockId >= 0 && blockId < this.numBlocks, `block id ${blockId} out of range`);
    return this.blocks[blockId] as KVCacheBlock;
  }

  getNumFreeBlocks(): number {
    return this.freeQueue.length;
  }

  /** Pop `n` blocks from the LRU head; each gets refCnt 1 and loses any prefix-cache entry. */
  getNewBlocks(n: number): KVCacheBlock[] {
    assert(Number.isInteger(n) && n >= 0, `bad block count ${n}`);
    assert(n <= this.freeQueue.length, () => `cannot get ${n} blocks, only ${this.freeQueue.length} free`);
    const out: KVCacheBlock[] = [];
    for (let i = 0; i < n; i++) {
      const block = this.freeQueue.popLeft();
      assert(
        block.refCnt === 0 && !block.isNull,
        () => `free queue held block ${block.blockId} with refCnt ${block.refCnt}`,
      );
      this.evict(block);
      block.refCnt = 1;
      out.push(block);
    }
    if (this.observers !== null) {
      const ids = out.map((b) => b.blockId);
      for (const o of this.observers) o.allocated(ids);
    }
    return out;
  }

  /**
   * Drop one reference per block; blocks reaching 0 go to the tail. Callers pass a request's blocks in reverse order.
   */
  freeBlocks(blocks: Iterable<KVCacheBlock>): void {
    const freed: number[] | null = this.observers === null ? null : [];
    for (const block of blocks) {
      assert(!block.isNull, 'the null block is never freed');
      // Invariant: reference counts never go negative.
      assert(block.refCnt > 0, () => `block ${block.blockId} freed with refCnt ${block.refCnt}`);
      block.refCnt--;
      if (block.refCnt === 0) {
        this.freeQueue.append(block);
        freed?.push(block.blockId);
      }
    }
    if (this.observers !== null && freed !== null) for (const o of this.observers) o.freed(freed);
  }

  /** Take one more reference per block (a prefix hit); a free block leaves the queue but keeps its hash. */
  touch(blocks: Iterable<KVCacheBlock>): void {
    const revived: number[] | null = this.observers === null ? null : [];
    for (const block of blocks) {
      assert(!block.isNull, 'the null block is never touched');
      if (block.refCnt === 0) {
        this.freeQueue.remove(block);
        revived?.push(block.blockId);
      }
      block.refCnt++;
    }
    if (this.observers !== null && revived !== null) for (const o of this.observers) o.revived(revived);
  }

  /** Report allocations, revivals and frees from now on to `o` (observe, never change). Returns unsubscribe. */
  observe(o: BlockPoolObserver): () => void {
    assert(!(this.observers ?? []).includes(o), 'observer already watches this pool');
    this.observers = [...(this.observers ?? []), o];
    return () => {
      const rest = (this.observers ?? []).filter((x) => x !== o);
      this.observers = rest.length === 0 ? null : rest;
    };
  }

  /** Publish KV events (kv_events.ts) to `sink` from now on; the pool must not hold cached pages yet. */
  publishEvents(sink: KvEventSink): void {
    assert(this.events === null, 'the pool already publishes KV events');
    assert(this.cached.size === 0, 'KV events must start before anything is cached (the index starts empty)');
    this.events = sink;
  }

  get publishing(): boolean {
    return this.events !== null;
  }

  /** Emit a BlockStored for hashes that cacheBlock reported as new (each must be cached now). */
  publishStored(event: Omit<BlockStored, 'type' | 'lora_id' | 'medium'>): void {
    if (this.events === null) return;
    assert(event.block_hashes.length > 0, 'BlockStored names at least one block');
    assert(
      event.token_ids.length === event.block_hashes.length * event.block_size,
      () => `BlockStored: ${event.token_ids.length} tokens for ${event.block_hashes.length} blocks`,
    );
    for (const h of event.block_hashes) assert(this.cached.has(h), () => `BlockStored for uncached hash ${h}`);
    this.events.emit({ type: 'BlockStored', ...event, lora_id: null, medium: MEDIUM_GPU });
  }

  /** Every hash with at least one cached page (a KV event dump). */
  cachedHashes(): BlockHash[] {
    return [...this.cached.keys()];
  }

  getCachedBlock(hash: BlockHash): KVCacheBlock | null {
    const entry = this.cached.get(hash);
    if (entry === undefined) return null;
    const first = entry.values().next();
    assert(!first.done, 'empty prefix-cache entry left in the map');
    return first.value;
  }

  /**
   * Publish a full, owned block under `hash`. Two blocks may share a hash (both computed it). Returns
   * true when the hash was not cached before (the caller then publishes a BlockStored for it).
   */
  cacheBlock(block: KVCacheBlock, hash: BlockHash, parent: KVCacheBlock | null = null): boolean {
    assert(this.enableCaching, 'cacheBlock with prefix caching off');
    assert(
      !block.isNull && block.refCnt > 0,
      () => `only owned blocks are cached (block ${block.blockId}, refCnt ${block.refCnt})`,
    );
    assert(block.blockHash === null, () => `block ${block.blockId} already cached as ${block.blockHash}`);
    block.blockHash = hash;
    if (parent !== null) this.link(block, parent);
    let entry = this.cached.get(hash);
    const added = entry === undefined;
    if (entry === undefined) {
      entry = new Map();
      this.cached.set(hash, entry);
    }
    entry.set(block.blockId, block);
    return added;
  }

  /** Record that cached `kid` was computed over cached `parent` (withdrawing `parent` withdraws `kid`). */
  link(kid: KVCacheBlock, parent: KVCacheBlock): void {
    if (kid.blockHash === null || parent.blockHash === null) return;
    (kid.parents ??= new Set()).add(parent);
    (parent.kids ??= new Set()).add(kid);
  }

  /**
   * Withdraw an owned block from the prefix cache (its KV turned out not to be valid), and with it every
   * cached page computed over it, owned or free (`kids`, transitively): requests that may have left long
   * ago computed them attending over this KV, so theirs is not valid either. Returns the withdrawn ids.
   */
  uncache(block: KVCacheBlock): number[] {
    assert(
      !block.isNull && block.refCnt > 0,
      () => `only owned blocks are withdrawn (block ${block.blockId}, refCnt ${block.refCnt})`,
    );
    const withdrawn: number[] = [];
    const stack = [block];
    // Bounded: each step withdraws one cached page; a withdrawn page has no kids and is skipped.
    for (let b = stack.pop(); b !== undefined; b = stack.pop()) {
      if (b.blockHash === null) continue;
      if (b.kids !== null) stack.push(...b.kids);
      this.evict(b);
      withdrawn.push(b.blockId);
    }
    return withdrawn;
  }

  numCachedBlocks(): number {
    let n = 0;
    for (const entry of this.cached.values()) n += entry.size;
    return n;
  }

  /** Fraction of the usable pages (all but the null block) that are in use. */
  usage(): number {
    return 1 - this.freeQueue.length / (this.numBlocks - 1);
  }

  /** Forget every cached hash. Like vLLM, refused (false) while any page is in use. */
  resetPrefixCache(): boolean {
    if (this.freeQueue.length !== this.numBlocks - 1) return false;
    for (const b of this.blocks) {
      b.blockHash = null;
      b.parents = null;
      b.kids = null;
    }
    this.cached.clear();
    this.events?.emit({ type: 'AllBlocksCleared' });
    return true;
  }

  /** Free block ids from the LRU head (reused first) to the tail. For oracles and tests. */
  freeBlockIds(): number[] {
    return this.freeQueue.toArray().map((b) => b.blockId);
  }

  /** Check every invariant of the module comment; throws AssertionFailure on the first broken one. */
  verify(): void {
    const queued = new Set(this.freeQueue.toArray());
    assert(
      this.nullBlock.refCnt === 1 && !queued.has(this.nullBlock),
      'null block must stay held and out of the queue',
    );
    assert(this.nullBlock.blockHash === null, 'null block must never be cached');
    for (const b of this.blocks) {
      assert(b.refCnt >= 0, () => `block ${b.blockId} has refCnt ${b.refCnt}`);
      if (!b.isNull)
        assert(
          queued.has(b) === (b.refCnt === 0),
          () => `block ${b.blockId}: refCnt ${b.refCnt} but queued=${queued.has(b)}`,
        );
      if (b.blockHash !== null)
        assert(this.cached.get(b.blockHash)?.get(b.blockId) === b, () => `block ${b.blockId} hash not in the map`);
      else assert(b.parents === null && b.kids === null, () => `uncached block ${b.blockId} keeps chain links`);
      for (const p of b.parents ?? [])
        assert(p.kids?.has(b) === true, () => `block ${b.blockId} missing from its parent ${p.blockId}'s kids`);
      for (const k of b.kids ?? [])
        assert(k.parents?.has(b) === true, () => `block ${k.blockId} is a kid of ${b.blockId}, unlinked`);
    }
    for (const [hash, entry] of this.cached) {
      assert(entry.size > 0, 'empty prefix-cache entry');
      for (const b of entry.values())
        assert(b.blockHash === hash, () => `map entry ${hash} points to block ${b.blockId} with hash ${b.blockHash}`);
    }
  }

  private evict(block: KVCacheBlock): void {
    if (block.blockHash === null) return;
    const entry = this.cached.get(block.blockHash);
    assert(entry?.get(block.blockId) === block, () => `cached block ${block.blockId} missing from the map`);
    entry.delete(block.blockId);
    if (entry.size === 0) {
      this.cached.delete(block.blockHash);
      this.events?.emit({ type: 'BlockRemoved', block_hashes: [block.blockHash], medium: MEDIUM_GPU });
    }
    block.blockHash = null;
    for (const p of block.parents ?? []) p.kids?.delete(block);
    block.parents = null;
    for (const k of block.kids ?? []) k.parents?.delete(block);
    block.kids = null;
  }
}
