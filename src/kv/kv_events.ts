/**
 * KV cache events, vLLM's format (vllm/distributed/kv_events.py), as plain wire data (snake_case, a
 * `type` tag like msgspec's tagged structs), and the per-instance publisher that batches them.
 *
 *   BlockPool ──emit──> KvEventPublisher ──flush (end of the synchronous run that emitted)──> batch
 *                         pending events      seq 1, 2, 3 ... (monotonic per epoch)      ├─> subscribers
 *                                                                                         └─> replay ring (bounded)
 *
 * Set semantics: a hash is "stored" when the first page holding it is published for prefix hits and
 * "removed" when the last page holding it leaves the cache (evicted for reuse, or withdrawn). So the
 * hashes named by the events, replayed in sequence order, are exactly the pool's cached-hash set; that
 * is what a router's index needs (routing by hash, never by page id). `AllBlocksCleared` empties it.
 *
 * Recovery: a consumer that sees a gap (a seq it never got, or `since` older than the ring) asks for
 * `dump()`: the whole set at the last flushed seq. An `epoch` names one life of the publisher: a
 * restarted instance starts a new epoch at seq 1, so stale state is never mixed with new.
 */
import { assert } from '../util/assert.ts';
import type { BlockHash } from './block_hash.ts';

export const MEDIUM_GPU = 'GPU';

export interface BlockStored {
  type: 'BlockStored';
  /** Consecutive blocks of one request's chain, in order. */
  block_hashes: BlockHash[];
  /** The hash of the block before the first one (null: the first block of a prompt). */
  parent_block_hash: BlockHash | null;
  /** block_hashes.length × block_size tokens. */
  token_ids: number[];
  block_size: number;
  lora_id: null;
  medium: string;
  group_idx: number;
}

export interface BlockRemoved {
  type: 'BlockRemoved';
  block_hashes: BlockHash[];
  medium: string;
}

export interface AllBlocksCleared {
  type: 'AllBlocksCleared';
}

export type KvCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared;

/** vLLM's KVEventBatch plus the sequence number and epoch its ZMQ frame carries beside it. */
export interface KvEventBatch {
  epoch: string;
  seq: number;
  /** Wall-clock seconds. */
  ts: number;
  events: KvCacheEvent[];
}

/** Every cached hash at `seq` (all batches up to and including it applied). */
export interface KvEventDump {
  epoch: string;
  seq: number;
  block_hashes: BlockHash[];
}

export interface KvEventSink {
  emit(event: KvCacheEvent): void;
}

export type KvEventListener = (batch: KvEventBatch) => void;

export const KV_EVENT_REPLAY_MAX = 4096;

/**
 * An epoch names one life of an instance and orders lives: `<start wall-clock ms>-<id>`. A router that
 * hears of two lives of one instance keeps the later one, whatever order their messages arrive in.
 */
export function kvEventEpoch(startedWallMs: number, id: string): string {
  assert(Number.isFinite(startedWallMs) && startedWallMs >= 0, 'an epoch starts at a wall-clock time');
  return `${Math.floor(startedWallMs)}-${id}`;
}

/** The start time of an epoch made by kvEventEpoch; null for any other string (then lives are unordered). */
export function epochStartMs(epoch: string): number | null {
  const m = /^(\d{1,16})-/.exec(epoch);
  return m === null ? null : Number(m[1]);
}

export interface KvEventPublisherOptions {
  epoch: string;
  /** Wall-clock milliseconds (the batch's ts). */
  wallMs: () => number;
  /** The pool's cached hashes now (for dump()). */
  snapshot: () => BlockHash[];
  /** Batches kept for `since` replays. */
  replayMax?: number;
}

export class KvEventPublisher implements KvEventSink {
  readonly epoch: string;
  private pending: KvCacheEvent[] = [];
  private flushQueued = false;
  private lastSeq = 0;
  /** The last `replayMax` batches, oldest first. */
  private readonly ring: KvEventBatch[] = [];
  private readonly listeners = new Set<KvEventListener>();
  private readonly replayMax: number;
  stats = { batches: 0, events: 0, dumps: 0 };

  constructor(private readonly opts: KvEventPublisherOptions) {
    assert(opts.epoch.length > 0, 'a KV event publisher needs an epoch');
    this.epoch = opts.epoch;
    this.replayMax = opts.replayMax ?? KV_EVENT_REPLAY_MAX;
    assert(Number.isInteger(this.replayMax) && this.replayMax >= 1, `bad replayMax ${this.replayMax}`);
  }

  get seq(): number {
    return this.lastSeq;
  }

  /**
   * Queue an event; the batch closes at the end of the current synchronous run (a microtask), so one
   * scheduler step's changes travel together and the order of emission is the order of application.
   */
  emit(event: KvCacheEvent): void {
    this.pending.push(event);
    this.stats.events++;
    if (this.flushQueued) return;
    this.flushQueued = true;
    queueMicrotask(() => {
      this.flushQueued = false;
      this.flush();
    });
  }

  /** Close the pending batch now (no-op when empty); returns it. */
  flush(): KvEventBatch | null {
    if (this.pending.length === 0) return null;
    const batch: KvEventBatch = {
      epoch: this.epoch,
      seq: ++this.lastSeq,
      ts: this.opts.wallMs() / 1000,
      events: this.pending,
    };
    this.pending = [];
    this.ring.push(batch);
    if (this.ring.length > this.replayMax) this.ring.shift();
    this.stats.batches++;
    for (const l of [...this.listeners]) l(batch);
    return batch;
  }

  /** Batches after `since`, oldest first; null when some of them are no longer kept (dump instead). */
  since(since: number): KvEventBatch[] | null {
    assert(Number.isInteger(since) && since >= 0, `bad since ${since}`);
    this.flush();
    if (since > this.lastSeq) return null; // a seq from another epoch
    if (since === this.lastSeq) return [];
    const oldest = this.ring[0]?.seq ?? this.lastSeq + 1;
    if (since < oldest - 1) return null;
    return this.ring.slice(since - oldest + 1);
  }

  /** The whole cached set at the current seq (pending events flushed first, so the two agree). */
  dump(): KvEventDump {
    this.flush();
    this.stats.dumps++;
    return { epoch: this.epoch, seq: this.lastSeq, block_hashes: this.opts.snapshot() };
  }

  subscribe(listener: KvEventListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  get numSubscribers(): number {
    return this.listeners.size;
  }
}
