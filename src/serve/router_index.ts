/**
 * RouterIndex: what the router believes each instance's prefix cache holds, rebuilt from the instances'
 * KV event batches (kv/kv_events.ts) and dumps.
 *
 *   instance ──> {epoch, seq, hashes, pending batches (out of order), needsDump}
 *
 * The router scores an instance by walking a prompt's hash chain through that instance's set (kv_router.ts);
 * there is no hash ──> instances map: nothing reads one, and keeping one cost a Set per hash, which made a
 * 1 Mi-hash dump take the router's event loop for seconds (session 19).
 *
 * Sequence numbers make delivery faults harmless: a batch at or below the applied seq is a duplicate
 * (dropped); one beyond seq + 1 waits in `pending` for the missing ones (a reorder); when more than
 * `maxPending` wait, or a heartbeat says the instance is further than anything received (lost tail),
 * the instance needs a dump, which replaces its set at the dump's seq. A new epoch (the instance
 * restarted) drops everything known about its old life; epochs are ordered by their start time
 * (kvEventEpoch), and a retired or older epoch's late batch, dump or heartbeat is ignored, never
 * resurrected. Invariant: once an instance's applied seq equals the instance's own seq (nothing
 * pending), its set here equals its pool's cached-hash set.
 */
import { assert } from '../util/assert.ts';
import { mutationsFor, type MutantName } from '../util/mutants.ts';
import type { BlockHash } from '../kv/block_hash.ts';
import { epochStartMs, type KvEventBatch, type KvEventDump } from '../kv/kv_events.ts';

export type ApplyResult = 'applied' | 'duplicate' | 'buffered' | 'needs-dump';

/** What the index applies of an event (a batch waiting for a gap keeps no more: not a BlockStored's tokens). */
type HashEvent =
  { type: 'AllBlocksCleared' } | { type: 'BlockStored' | 'BlockRemoved'; block_hashes: readonly BlockHash[] };

interface PendingBatch {
  seq: number;
  events: HashEvent[];
}

interface InstanceState {
  epoch: string | null;
  /** Every batch up to this seq is applied. */
  seq: number;
  hashes: Set<BlockHash>;
  pending: Map<number, PendingBatch>;
  /** Events and block hashes of the pending batches (bounded like the set itself). */
  pendingHashes: number;
  /** Batches were lost (a heartbeat ahead of us) or the feed broke a bound: only a dump helps. */
  forced: boolean;
  /** Epochs this instance left (it restarted): anything still arriving from them is stale. Bounded. */
  retired: string[];
}

const RETIRED_EPOCHS_MAX = 16;
/** Out-of-order batches held per instance at most (whatever maxPending asks for). */
const PENDING_MAX = 1024;

/** What a pending batch costs against the bound: each event, and each hash it names. */
function hashCount(events: readonly HashEvent[]): number {
  let n = events.length;
  for (const e of events) if (e.type !== 'AllBlocksCleared') n += e.block_hashes.length;
  return n;
}

function pendingOf(batch: KvEventBatch): PendingBatch {
  const events = batch.events.map((e): HashEvent =>
    e.type === 'AllBlocksCleared' ? { type: e.type } : { type: e.type, block_hashes: e.block_hashes },
  );
  return { seq: batch.seq, events };
}

export interface RouterIndexOptions {
  /**
   * The bug zoo's switches (simulator only): `kv-index-ignores-seq` applies batches as they arrive,
   * `kv-index-ignores-removed` drops BlockRemoved events.
   */
  mutant?: MutantName;
  /** Out-of-order batches held per instance before asking for a dump (0: any gap asks at once). */
  maxPending: number;
  /** Bound on one instance's hashes (a hostile or broken feed cannot grow the index without end). */
  maxHashesPerInstance: number;
}

export const DEFAULT_ROUTER_INDEX_OPTIONS: RouterIndexOptions = { maxPending: 0, maxHashesPerInstance: 1 << 20 };

export class RouterIndex {
  private readonly instances = new Map<string, InstanceState>();
  stats = { applied: 0, duplicates: 0, buffered: 0, dumps: 0, epochs: 0 };
  private readonly bySeq: boolean;
  private readonly removes: boolean;

  constructor(private readonly opts: RouterIndexOptions = DEFAULT_ROUTER_INDEX_OPTIONS) {
    assert(Number.isInteger(opts.maxPending) && opts.maxPending >= 0, 'maxPending is a count');
    this.bySeq = mutationsFor(opts.mutant).orderKvEventsBySeq;
    this.removes = mutationsFor(opts.mutant).applyKvBlockRemoved;
  }

  private state(key: string): InstanceState {
    let st = this.instances.get(key);
    if (st === undefined) {
      st = { epoch: null, seq: 0, hashes: new Set(), pending: new Map(), pendingHashes: 0, forced: false, retired: [] };
      this.instances.set(key, st);
    }
    return st;
  }

  /** Apply one batch of `key`'s events (any order, any number of times). */
  applyBatch(key: string, batch: KvEventBatch): ApplyResult {
    const st = this.state(key);
    if (!this.admit(st, batch.epoch)) return this.stale();
    if (!this.bySeq) {
      this.applyEvents(st, batch.events);
      st.seq = Math.max(st.seq, batch.seq);
      return 'applied';
    }
    if (batch.seq <= st.seq || st.pending.has(batch.seq)) {
      this.stats.duplicates++;
      return 'duplicate';
    }
    if (batch.seq !== st.seq + 1) {
      const hashes = hashCount(batch.events);
      if (st.pendingHashes + hashes > this.opts.maxHashesPerInstance || st.pending.size >= PENDING_MAX) {
        // A feed that keeps running ahead of itself (hostile or broken): drop what waits, start from a dump.
        this.clearPending(st);
        st.forced = true;
        return 'needs-dump';
      }
      st.pending.set(batch.seq, pendingOf(batch));
      st.pendingHashes += hashes;
      this.stats.buffered++;
      return this.needsDump(key) ? 'needs-dump' : 'buffered';
    }
    this.applyEvents(st, batch.events);
    st.seq = batch.seq;
    this.drainPending(st);
    return 'applied';
  }

  /** Replace `key`'s set with a dump; pending batches after the dump's seq are applied on top. */
  applyDump(key: string, dump: KvEventDump): void {
    const within = dump.block_hashes.length <= this.opts.maxHashesPerInstance;
    this.adoptDump(key, dump.epoch, dump.seq, within ? new Set(dump.block_hashes) : null);
  }

  /**
   * applyDump with the dump's hashes already in a set, which the index keeps (the caller lets go of it);
   * null: the dump was over the bound.
   */
  adoptDump(key: string, epoch: string, seq: number, hashes: Set<BlockHash> | null): void {
    const st = this.state(key);
    if (!this.admit(st, epoch)) return void this.stale();
    // An older dump than what is applied (a slow answer) changes nothing.
    if (seq < st.seq) return;
    // A dump over the bound is not adopted in part (its tail would look caught up): the instance is held
    // to have nothing, at the dump's seq, until later batches say otherwise.
    st.hashes = hashes ?? new Set();
    st.seq = seq;
    st.forced = false;
    for (const [s, b] of [...st.pending]) if (s <= seq) this.dropPending(st, s, b);
    // Still waiting for batches the dump does not reach: they are not coming (the instance is behind
    // what its feed sent), so they are dropped rather than asking for a dump per line.
    if (st.pending.size > this.opts.maxPending && !st.pending.has(st.seq + 1)) this.clearPending(st);
    this.drainPending(st);
    this.stats.dumps++;
  }

  /**
   * The instance says where it is (a heartbeat, /handoff/info): a new epoch, or a seq beyond what was
   * received with nothing pending to fill it, means batches were lost: the instance needs a dump.
   */
  heartbeat(key: string, epoch: string, seq: number): boolean {
    const st = this.state(key);
    if (!this.admit(st, epoch)) {
      this.stale();
      return this.needsDump(key);
    }
    if (seq > st.seq && this.bySeq) st.forced = true;
    return this.needsDump(key);
  }

  /**
   * `epoch` is the instance's current life (a feed heard it first on a fresh connection: one URL is one
   * process, so whatever it says now is its present), adopted even if its start time is earlier than the
   * life the index follows (a clock stepped back across a restart). Its earlier lives become stale.
   */
  adopt(key: string, epoch: string): void {
    const st = this.state(key);
    if (st.epoch === epoch) return;
    st.retired = st.retired.filter((e) => e !== epoch);
    this.newEpoch(st, epoch);
  }

  needsDump(key: string): boolean {
    const st = this.instances.get(key);
    return st !== undefined && (st.forced || st.pending.size > this.opts.maxPending);
  }

  /** The bound on one instance's hashes (a dump with more is not adopted). */
  get maxHashesPerInstance(): number {
    return this.opts.maxHashesPerInstance;
  }

  /** Forget an instance entirely (removed from the pool). */
  forget(key: string): void {
    this.instances.delete(key);
  }

  /** Leading hashes of `chain` that `key` holds (a prefix: stops at the first miss). */
  prefixLength(key: string, chain: readonly BlockHash[]): number {
    const st = this.instances.get(key);
    if (st === undefined) return 0;
    let n = 0;
    while (n < chain.length && st.hashes.has(chain[n] as BlockHash)) n++;
    return n;
  }

  hashesOf(key: string): ReadonlySet<BlockHash> {
    return this.instances.get(key)?.hashes ?? new Set();
  }

  /** Applied seq and epoch of `key` (0/null before anything arrived). */
  position(key: string): { epoch: string | null; seq: number; pending: number } {
    const st = this.instances.get(key);
    return { epoch: st?.epoch ?? null, seq: st?.seq ?? 0, pending: st?.pending.size ?? 0 };
  }

  /** False for a message of an earlier life (retired, or started before the current one); a later life replaces it. */
  private admit(st: InstanceState, epoch: string): boolean {
    if (st.epoch === epoch) return true;
    if (st.retired.includes(epoch)) return false;
    const [mine, theirs] = [st.epoch === null ? null : epochStartMs(st.epoch), epochStartMs(epoch)];
    if (mine !== null && theirs !== null && theirs < mine) {
      st.retired.push(epoch);
      if (st.retired.length > RETIRED_EPOCHS_MAX) st.retired.shift();
      return false;
    }
    this.newEpoch(st, epoch);
    return true;
  }

  /** Something from an instance's earlier life (a late batch, dump or heartbeat): ignored. */
  private stale(): 'duplicate' {
    this.stats.duplicates++;
    return 'duplicate';
  }

  private newEpoch(st: InstanceState, epoch: string): void {
    if (st.epoch !== null) {
      this.stats.epochs++;
      st.retired.push(st.epoch);
      if (st.retired.length > RETIRED_EPOCHS_MAX) st.retired.shift();
    }
    this.clearHashes(st);
    st.epoch = epoch;
    st.seq = 0;
    this.clearPending(st);
    st.forced = false;
  }

  private dropPending(st: InstanceState, seq: number, b: PendingBatch): void {
    st.pending.delete(seq);
    st.pendingHashes -= hashCount(b.events);
  }

  private clearPending(st: InstanceState): void {
    st.pending.clear();
    st.pendingHashes = 0;
  }

  private drainPending(st: InstanceState): void {
    for (let next = st.pending.get(st.seq + 1); next !== undefined; next = st.pending.get(st.seq + 1)) {
      this.dropPending(st, next.seq, next);
      this.applyEvents(st, next.events);
      st.seq = next.seq;
    }
  }

  private applyEvents(st: InstanceState, events: readonly HashEvent[]): void {
    for (const ev of events) {
      if (ev.type === 'AllBlocksCleared') this.clearHashes(st);
      else if (ev.type === 'BlockStored') for (const h of ev.block_hashes) this.add(st, h);
      else if (this.removes) for (const h of ev.block_hashes) st.hashes.delete(h);
    }
    this.stats.applied++;
  }

  private add(st: InstanceState, h: BlockHash): void {
    if (st.hashes.has(h)) return;
    if (st.hashes.size >= this.opts.maxHashesPerInstance) {
      // Past the bound the feed cannot be trusted: start over from a dump.
      this.clearHashes(st);
      st.forced = true;
      return;
    }
    st.hashes.add(h);
  }

  private clearHashes(st: InstanceState): void {
    st.hashes = new Set();
  }
}
