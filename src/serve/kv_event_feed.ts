/**
 * KvEventFeed: the router's side of one instance's KV event stream (kv_event_stream.ts). It keeps the
 * RouterIndex entry of that instance current:
 *
 *   connect  GET /handoff/kv_events?since=<applied seq>  ──lines──> batch → index.applyBatch
 *                                                                 heartbeat → index.heartbeat → load
 *   gap      (a heartbeat ahead of what is applied, or a batch after a missing one)
 *            GET /handoff/kv_events/dump → index.applyDump
 *   broken   (connection lost, nothing heard for `stallMs`) → reconnect after `retryMs`, same `since`
 *
 * Every line is validated before it touches the index: the feed is input from the network.
 */
import { rethrowIfAssertion } from '../util/assert.ts';
import { nextMacrotask, type Env, type TimerHandle } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import type { Logger } from '../util/log.ts';
import type { KvCacheEvent, KvEventBatch } from '../kv/kv_events.ts';
import type { InstanceLoad } from './kv_event_stream.ts';
import type { RouterIndex } from './router_index.ts';
import { readBoundedText } from './upstream.ts';
import { DumpScanner, isEpoch, isSeq } from './dump_scan.ts';
import { parseJsonText } from './http_io.ts';

/** Hashes read per slice of a dump (a few milliseconds of the router's event loop). */
const DUMP_SLICE_HASHES = 8192;
/** Longest line accepted (a BlockStored of a whole long prompt with its token ids is far below). */
export const KV_FEED_LINE_MAX_BYTES = 32 << 20;
const HASH_RE = /^[0-9a-f]{64}$/;
/** A dump's body at most: 1 Mi hashes of 64 hex digits, quoted, with commas, and room to spare. */
const DUMP_MAX_BYTES = 96 << 20;
/** Dumps a feed fetches at most once per this long. */
export const DUMP_MIN_INTERVAL_MS = 1000;
/** And at most once per this many times what applying the last one took (its share of the router's loop). */
const DUMP_COST_FACTOR = 10;

/**
 * Split a byte stream into lines (without the newline), each at most `maxBytes`. Each chunk is scanned
 * once and a partial line is kept as its pieces, so a long line costs its length, not its length times
 * its chunks (a hostile instance's 32 MiB line in 64 KiB chunks blocked the event loop for 30 s).
 */
export async function* ndjsonLines(body: AsyncIterable<Uint8Array>, maxBytes: number): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  let pieces: string[] = [];
  let partial = 0;
  for await (const chunk of body) {
    const text = decoder.decode(chunk, { stream: true });
    let from = 0;
    for (let nl = text.indexOf('\n'); nl >= 0; nl = text.indexOf('\n', from)) {
      pieces.push(text.slice(from, nl));
      const line = pieces.length === 1 ? (pieces[0] as string) : pieces.join('');
      pieces = [];
      partial = 0;
      from = nl + 1;
      if (line.trim().length > 0) yield line;
    }
    if (from < text.length) {
      pieces.push(text.slice(from));
      partial += text.length - from;
    }
    if (partial > maxBytes) throw new HandoffError('BAD_REQUEST', `KV event line longer than ${maxBytes} bytes`);
  }
}

export type FeedLine =
  { kind: 'batch'; batch: KvEventBatch } | { kind: 'heartbeat'; epoch: string; seq: number; load: InstanceLoad | null };

const bad = (why: string): HandoffError => new HandoffError('BAD_REQUEST', `bad KV event line: ${why}`);

function hashesOf(v: unknown): string[] {
  if (!Array.isArray(v) || v.some((h) => typeof h !== 'string' || !HASH_RE.test(h))) throw bad('block_hashes');
  return v as string[];
}

function eventOf(v: unknown): KvCacheEvent {
  const e = v as Record<string, unknown> | null;
  if (e === null || typeof e !== 'object') throw bad('event is not an object');
  if (e['type'] === 'AllBlocksCleared') return { type: 'AllBlocksCleared' };
  if (e['type'] === 'BlockRemoved')
    return { type: 'BlockRemoved', block_hashes: hashesOf(e['block_hashes']), medium: String(e['medium']) };
  if (e['type'] !== 'BlockStored') throw bad(`unknown event type ${String(e['type']).slice(0, 40)}`);
  // The router uses the hashes only; the rest is carried for consumers that re-hash tokens.
  return { ...(e as unknown as KvCacheEvent & { type: 'BlockStored' }), block_hashes: hashesOf(e['block_hashes']) };
}

function loadOf(v: unknown): InstanceLoad | null {
  const l = v as Record<string, unknown> | null;
  const keys = ['running', 'waiting', 'held_for_send', 'held_for_send_pages', 'free_pages', 'total_pages'] as const;
  if (l === null || typeof l !== 'object' || keys.some((k) => !isSeq(l[k]))) return null;
  return Object.fromEntries(keys.map((k) => [k, l[k]])) as unknown as InstanceLoad;
}

/** One line of the feed, validated. */
export function parseFeedLine(text: string): FeedLine {
  const v = parseJsonText(text, () => bad('not JSON'));
  const o = v as Record<string, unknown> | null;
  if (o === null || typeof o !== 'object' || !isEpoch(o['epoch']) || !isSeq(o['seq'])) throw bad('epoch/seq');
  if (o['heartbeat'] === true) return { kind: 'heartbeat', epoch: o['epoch'], seq: o['seq'], load: loadOf(o['load']) };
  if (!Array.isArray(o['events']) || o['seq'] < 1) throw bad('events');
  const ts = typeof o['ts'] === 'number' ? o['ts'] : 0;
  return { kind: 'batch', batch: { epoch: o['epoch'], seq: o['seq'], ts, events: o['events'].map(eventOf) } };
}

export interface KvEventFeedOptions {
  url: string;
  apiKey: string | null;
  /** Reconnect delay after a failure. */
  retryMs: number;
  /** Silence (no line) after which the connection is considered dead. */
  stallMs: number;
  /** Each heartbeat's load. */
  onLoad?: (load: InstanceLoad | null) => void;
}

export class KvEventFeed {
  private closed = false;
  private current: AbortController | null = null;
  private loop: Promise<void> = Promise.resolve();
  load: InstanceLoad | null = null;
  stats = { connects: 0, lines: 0, dumps: 0, dumpYields: 0, badLines: 0 };
  private lastDumpMs = -Infinity;
  /** What parsing and applying the last dump took the router's event loop. */
  private lastDumpCostMs = 0;

  constructor(
    private readonly key: string,
    private readonly index: RouterIndex,
    private readonly opts: KvEventFeedOptions,
    private readonly env: Env,
    private readonly log?: Logger,
  ) {}

  start(): void {
    this.loop = this.run();
  }

  async close(): Promise<void> {
    this.closed = true;
    this.current?.abort();
    await this.loop;
  }

  private headers(): Record<string, string> {
    return this.opts.apiKey ? { authorization: `Bearer ${this.opts.apiKey}` } : {};
  }

  private async run(): Promise<void> {
    while (!this.closed) {
      try {
        await this.connectOnce();
      } catch (e) {
        rethrowIfAssertion(e);
        if (!this.closed) this.log?.debug({ url: this.opts.url, err: (e as Error).message }, 'KV event feed broke');
      }
      if (!this.closed) await this.env.sleep(this.opts.retryMs);
    }
  }

  private async connectOnce(): Promise<void> {
    const ac = new AbortController();
    this.current = ac;
    let stall: TimerHandle | null = null;
    const arm = (): void => {
      stall?.cancel();
      stall = this.env.setTimer(this.opts.stallMs, () => ac.abort());
    };
    arm();
    const linesBefore = this.stats.lines;
    try {
      const since = this.index.position(this.key).seq;
      const r = await fetch(`${this.opts.url}/handoff/kv_events?since=${since}`, {
        headers: this.headers(),
        signal: ac.signal,
      });
      if (!r.ok || r.body === null) throw new HandoffError('PEER_UNAVAILABLE', `KV event feed answered ${r.status}`);
      this.stats.connects++;
      let fresh = true;
      for await (const text of ndjsonLines(r.body, KV_FEED_LINE_MAX_BYTES)) {
        arm();
        await this.onLine(text, ac.signal, fresh, arm);
        fresh = false;
        if (this.closed) break;
      }
    } finally {
      (stall as TimerHandle | null)?.cancel();
      ac.abort();
      // A connection that brought nothing (refused, an error status, silent): the last load heard is stale
      // for good if none comes back, and routing weighed it still (an idle instance starved as busy).
      if (this.stats.lines === linesBefore && this.load !== null) this.setLoad(null);
    }
  }

  private setLoad(load: InstanceLoad | null): void {
    this.load = load;
    this.opts.onLoad?.(load);
  }

  /**
   * One line; a dump it calls for is fetched under the connection's signal (its stall timer, close()),
   * each chunk of the dump re-arming the timer (`arm`): a large dump over a slow link is progress, not a
   * stall, and cutting it at `stallMs` cut it on every retry, so the index never resynced.
   */
  private async onLine(text: string, signal: AbortSignal, fresh: boolean, arm: () => void): Promise<void> {
    this.stats.lines++;
    const line = parseFeedLine(text);
    // The first line of a connection speaks for the process behind the URL now: its life is the current one.
    if (fresh) this.index.adopt(this.key, line.kind === 'batch' ? line.batch.epoch : line.epoch);
    if (line.kind === 'batch') this.index.applyBatch(this.key, line.batch);
    else {
      this.setLoad(line.load);
      this.index.heartbeat(this.key, line.epoch, line.seq);
    }
    // At most one dump a second: a feed that keeps running ahead of its own dumps (hostile or broken)
    // costs one dump a second, not one a line; an honest gap waits at most that long for its dump. And
    // at most a tenth of the loop: a dump of 100 k hashes takes about a second to apply, so "one a second"
    // alone let such a feed keep the router's event loop busy back to back.
    const interval = Math.max(DUMP_MIN_INTERVAL_MS, DUMP_COST_FACTOR * this.lastDumpCostMs);
    if (this.index.needsDump(this.key) && this.env.nowMs() - this.lastDumpMs >= interval) {
      this.lastDumpMs = this.env.nowMs();
      await this.fetchDump(signal, arm);
    }
  }

  private async fetchDump(signal: AbortSignal, arm: () => void): Promise<void> {
    const r = await fetch(`${this.opts.url}/handoff/kv_events/dump`, { headers: this.headers(), signal });
    if (!r.ok) throw new HandoffError('PEER_UNAVAILABLE', `KV event dump answered ${r.status}`);
    const text = await readBoundedText(r, DUMP_MAX_BYTES, 'the KV event dump', arm);
    // Read a slice of hashes per turn of the event loop: the router serves between slices (dump_scan.ts).
    let cost = 0;
    let started = this.env.nowMs();
    try {
      const scan = new DumpScanner(text, this.index.maxHashesPerInstance);
      while (!scan.step(DUMP_SLICE_HASHES)) {
        cost += this.env.nowMs() - started;
        this.stats.dumpYields++;
        await nextMacrotask();
        if (signal.aborted) return; // closed (or stalled) meanwhile: the dump is dropped
        started = this.env.nowMs();
      }
      this.index.adoptDump(this.key, scan.epoch, scan.seq, scan.overBound ? null : scan.hashes);
    } finally {
      this.lastDumpCostMs = cost + this.env.nowMs() - started; // a refused dump cost its reading too
    }
    this.stats.dumps++;
  }
}
