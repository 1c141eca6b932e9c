/**
 * The instance's KV events over HTTP, for routers (one long-lived NDJSON response per subscriber):
 *
 *   GET /handoff/kv_events?since=SEQ   200 application/x-ndjson, one JSON object per line:
 *     {epoch, seq, ts, events: [...]}                 a KvEventBatch (kv/kv_events.ts), in seq order
 *     {epoch, seq, heartbeat: true, load: {...}}      where the publisher is: every batch up to seq has
 *                                                     been written above it; sent first (after the replay of
 *                                                     the batches after `since`, when the ring still has them)
 *                                                     and then every heartbeatMs
 *   GET /handoff/kv_events/dump        200 {epoch, seq, block_hashes}: the whole set at seq
 *
 * Why HTTP/NDJSON and not vLLM's ZMQ PUB + ROUTER replay socket: the instance already serves HTTP on one
 * port with one API key, so the feed needs no second port, no extra dependency, and passes wherever the
 * OpenAI API does; one TCP stream per subscriber keeps batches in order, `since` replaces the replay
 * socket, and a heartbeat ahead of what the subscriber applied is the gap signal (answered by a dump).
 * A subscriber that reads too slowly is cut off (bounded buffer) and reconnects with `since`. When every
 * slot is taken, a new subscriber takes the slot of the one furthest behind (the oldest when none is):
 * refusing it let idle clients that never read lock a router out of the feed for hours.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { nextMacrotask, type Env, type TimerHandle } from '../util/env.ts';
import { assert } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';
import type { KvEventBatch, KvEventDump } from '../kv/kv_events.ts';
import { ANSWER_STALL_MS, dropIfUnsent, onResponseGone } from './response_sinks.ts';

/** What the stream needs of an engine's publisher (kv/kv_events.ts KvEventPublisher). */
export interface KvEventSource {
  readonly epoch: string;
  readonly seq: number;
  since(seq: number): KvEventBatch[] | null;
  dump(): KvEventDump;
  flush(): KvEventBatch | null;
  subscribe(listener: (b: KvEventBatch) => void): () => void;
}

/** The load a router weighs (requests, pages), sent with every heartbeat. */
export interface InstanceLoad {
  running: number;
  waiting: number;
  held_for_send: number;
  held_for_send_pages: number;
  free_pages: number;
  total_pages: number;
}

export interface KvHeartbeat {
  epoch: string;
  seq: number;
  heartbeat: true;
  load: InstanceLoad;
}

export const KV_EVENT_SUBSCRIBERS_MAX = 16;
/** Bytes a subscriber may fall behind before it is cut off. */
export const KV_EVENT_BACKLOG_MAX_BYTES = 8 << 20;
export const DEFAULT_KV_HEARTBEAT_MS = 250;
/** Dumps answered at once at most. */
export const KV_DUMPS_IN_FLIGHT_MAX = 4;
/**
 * Hashes a dump writes per turn of the event loop: 67 KB, one socket write. Small, because `writableLength`
 * falls only as whole writes complete, and a slow client's progress is judged by it.
 */
const DUMP_SLICE_HASHES = 1024;
/** A dump's bytes the socket may hold back before the dump waits for it to take them. */
const DUMP_BUFFER_MAX_BYTES = 1 << 20;

export class KvEventStreams {
  /** Open streams and how to stop feeding each (unsubscribe, stop its heartbeat). */
  private readonly open = new Map<ServerResponse, () => void>();
  private dumpsInFlight = 0;

  constructor(
    private readonly source: KvEventSource,
    private readonly load: () => InstanceLoad,
    private readonly env: Env,
    private readonly heartbeatMs: number = DEFAULT_KV_HEARTBEAT_MS,
  ) {}

  get numOpen(): number {
    return this.open.size;
  }

  /**
   * The whole set, written a slice of hashes per turn of the event loop: a dump of 1 Mi hashes (67 MB of
   * JSON) made in one JSON.stringify held the instance's loop, and with it every engine step, for about
   * half a second per request (session 19). At most KV_DUMPS_IN_FLIGHT_MAX are answered at once (each
   * holds a snapshot of the set); more are refused OVERLOADED. A client that takes none of it for
   * `stallMs` is dropped: what the socket did not take stayed queued in this process for as long as a
   * silent client kept its connection (forever), a fresh copy per such request.
   */
  async dump(res: ServerResponse, stallMs: number = ANSWER_STALL_MS): Promise<void> {
    if (this.dumpsInFlight >= KV_DUMPS_IN_FLIGHT_MAX)
      throw new HandoffError('OVERLOADED', `${KV_DUMPS_IN_FLIGHT_MAX} KV event dumps are being answered; try again`);
    this.dumpsInFlight++;
    try {
      const d = this.source.dump();
      res.writeHead(200, { 'content-type': 'application/json' });
      let head = `{"epoch":${JSON.stringify(d.epoch)},"seq":${d.seq},"block_hashes":[`;
      for (let i = 0; i < d.block_hashes.length; i += DUMP_SLICE_HASHES) {
        const part = JSON.stringify(d.block_hashes.slice(i, i + DUMP_SLICE_HASHES)).slice(1, -1);
        if (!(await this.sendSlice(res, `${head}${i > 0 ? ',' : ''}${part}`, stallMs))) return;
        head = '';
      }
      res.end(`${head}]}`);
      dropIfUnsent(res, stallMs, this.env);
    } finally {
      this.dumpsInFlight--;
    }
  }

  /**
   * Write one slice of a dump; resolves on the next turn of the loop, or once the socket has taken what
   * waits if that passed DUMP_BUFFER_MAX_BYTES. False: the client is gone, or took nothing for `stallMs`
   * (its connection is then closed); one that keeps taking some, however slowly, is waited for.
   */
  private async sendSlice(res: ServerResponse, text: string, stallMs: number): Promise<boolean> {
    if (res.destroyed || res.req.socket.destroyed) return false;
    res.write(text);
    if (res.writableLength <= DUMP_BUFFER_MAX_BYTES) {
      await nextMacrotask();
      return !res.destroyed;
    }
    const drained = await new Promise<boolean>((resolve) => {
      if (res.closed || res.req.socket.destroyed) return resolve(false);
      let left = res.writableLength;
      let timer: TimerHandle;
      const finish = (ok: boolean): void => {
        timer.cancel();
        res.off('drain', onDrain);
        res.off('close', onClose);
        resolve(ok);
      };
      // Like dropIfUnsent: a client that took some since the last look is slow, not gone.
      const look = (): void => {
        if (res.writableLength >= left) return finish(false);
        left = res.writableLength;
        timer = this.env.setTimer(stallMs, look);
      };
      const onDrain = (): void => finish(true);
      const onClose = (): void => finish(false);
      timer = this.env.setTimer(stallMs, look);
      res.on('drain', onDrain);
      res.on('close', onClose);
    });
    if (!drained) res.req.socket.destroy();
    return drained && !res.destroyed;
  }

  /** Serve one subscriber until it goes away (or the server closes). */
  stream(req: IncomingMessage, res: ServerResponse): void {
    const since = sinceOf(req.url ?? '');
    if (this.open.size >= KV_EVENT_SUBSCRIBERS_MAX) this.evictOne();
    assert(this.open.size < KV_EVENT_SUBSCRIBERS_MAX, 'a KV event subscriber slot is free');
    res.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-cache' });
    const writeLine = (line: string): void => {
      if (res.writableEnded || res.destroyed) return; // ended by closeAll, its 'close' not yet seen
      if (res.writableLength > KV_EVENT_BACKLOG_MAX_BYTES) {
        res.destroy(); // too slow: it reconnects with `since` and catches up from the ring or a dump
        return;
      }
      res.write(line);
    };
    const write = (obj: unknown): void => writeLine(`${JSON.stringify(obj)}\n`);
    for (const line of this.replayOf(since)) writeLine(line);
    const unsubscribe = this.source.subscribe(write);
    let timer: TimerHandle | null = null;
    const beat = (): void => {
      this.source.flush(); // every batch up to the heartbeat's seq is written above it
      write(this.heartbeat());
      timer = this.env.setTimer(this.heartbeatMs, beat);
    };
    const stop = (): void => {
      unsubscribe();
      (timer as TimerHandle | null)?.cancel();
      this.open.delete(res);
    };
    this.open.set(res, stop);
    beat();
    onResponseGone(res, stop); // also when it was pipelined and its connection closed before it started
  }

  /**
   * The batches after `since` as lines, or none when they pass the backlog bound: written at once they
   * would cut the stream before its heartbeat on every reconnect, so the router never caught up. Without
   * them, the heartbeat ahead of the subscriber makes it fetch a dump instead.
   */
  private replayOf(since: number | null): string[] {
    const lines: string[] = [];
    let bytes = 0;
    for (const b of since === null ? [] : (this.source.since(since) ?? [])) {
      const line = `${JSON.stringify(b)}\n`;
      bytes += Buffer.byteLength(line);
      if (bytes > KV_EVENT_BACKLOG_MAX_BYTES) return [];
      lines.push(line);
    }
    return lines;
  }

  /** Cut the subscriber furthest behind (bytes not yet taken), the oldest on a tie: it reconnects with `since`. */
  private evictOne(): void {
    let victim: [ServerResponse, () => void] | null = null;
    for (const entry of this.open)
      if (victim === null || entry[0].writableLength > victim[0].writableLength) victim = entry;
    assert(victim !== null, 'a full set of subscribers has one to evict');
    const [res, stop] = victim;
    stop(); // its slot is free now, not at the socket's close
    res.destroy();
  }

  heartbeat(): KvHeartbeat {
    return { epoch: this.source.epoch, seq: this.source.seq, heartbeat: true, load: this.load() };
  }

  /** End every stream (server shutdown). */
  closeAll(): void {
    for (const [res, stop] of [...this.open]) {
      stop(); // no batch or heartbeat after the end
      res.end();
    }
  }
}

/** `since` of the query string: a non-negative integer, or null when absent; BAD_REQUEST otherwise. */
export function sinceOf(url: string): number | null {
  const q = url.indexOf('?');
  const raw = q < 0 ? null : new URLSearchParams(url.slice(q + 1)).get('since');
  if (raw === null) return null;
  const n = Number(raw);
  if (!/^\d{1,15}$/.test(raw) || !Number.isSafeInteger(n))
    throw new HandoffError('BAD_REQUEST', `since must be a non-negative integer, got '${raw.slice(0, 40)}'`, {
      param: 'since',
    });
  return n;
}
