/**
 * The real device: slabs are SharedArrayBuffers visible to every thread, and the compute stream is
 * one worker thread that executes ops in FIFO order while the host goes on (with tensor parallel ranks:
 * one such thread per rank, `compute` fanning out over them, ranked_stream.ts, and the ranks' kernels
 * meeting in a collective over shared memory, threaded_collective.ts). The host never blocks:
 * it enqueues and later waits on tickets or events. A NIC thread (src/transfer) writes the same
 * slabs without waiting on this stream, so the seed's zeroing-vs-READ race really happens here.
 *
 *   host ──postMessage{seq, op}──> [ compute thread: op op op ]──writes──> SharedArrayBuffer slabs
 *        <──done{seq, result}────                     progress[0] = last executed seq (Atomics)
 *
 * The thread is ref'd only while it has work, so an idle device does not keep the process alive;
 * close() terminates it and rejects whatever is still pending.
 */
import { Worker } from 'node:worker_threads';
import { assert, AssertionFailure } from '../util/assert.ts';
import { holdingLoopOpen } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { Deferred } from './deferred.ts';
import { checkGeometry, deviceRanks } from './page_ops.ts';
import type { RaceChecker } from './race/race_checker.ts';
import { RankedStream, rankStreamName } from './ranked_stream.ts';
import type { StreamContext } from './stream_base.ts';
import { collectiveInit } from './threaded_collective.ts';
import { epochNowMs, type FromThread, type ThreadInit } from './threaded_protocol.ts';
import { ThreadedStream } from './threaded_stream.ts';
import { OpIdRaceChecker, OpTimeline, type TimedOp } from './threaded_timeline.ts';
import type { Device, DeviceOptions, Stream } from './types.ts';

export interface ThreadedDeviceOptions extends DeviceOptions {
  raceCheck?: boolean;
  /** Log every compute op with its real start and end from the start (see startTimeline). */
  timeline?: boolean;
}

/** The op log of a threaded device (not part of the Device interface: only real devices have one). */
export interface DeviceTimeline {
  /** Start logging ops enqueued from now on (idempotent). */
  startTimeline(): void;
  /** Ops logged so far, in enqueue order; empty when the log was never started. */
  timeline(): TimedOp[];
  /** The log's clock (epoch ms, shared with the compute thread), for events the host times itself. */
  timelineNowMs(): number;
}

/** The device's op log, or null when it is not a threaded device. */
export function deviceTimeline(device: Device): DeviceTimeline | null {
  return device instanceof ThreadedDevice ? device : null;
}

const THREAD_ENTRY = new URL('./threaded_thread.mjs', import.meta.url);

/** Start every rank's compute thread, load the kernel module in each, and return once all are ready. */
export async function createThreadedDevice(opts: ThreadedDeviceOptions): Promise<Device> {
  const g = checkGeometry(opts);
  const ranks = deviceRanks(opts);
  const buffers = Array.from({ length: g.numSlabs }, () => new SharedArrayBuffer(g.numBlocks * g.pageBytes));
  const collective = ranks > 1 ? collectiveInit(ranks) : null;
  const started = Array.from({ length: ranks }, async (_, rank) => {
    const progress = new SharedArrayBuffer(BigInt64Array.BYTES_PER_ELEMENT);
    const init: ThreadInit = {
      buffers,
      pageBytes: g.pageBytes,
      progress,
      kernelModuleUrl: opts.kernelModuleUrl,
      kernelInit: opts.kernelInit,
      rank: { rank, size: ranks, collective },
    };
    return { ...(await startThread(init)), progress };
  });
  const settled = await Promise.allSettled(started);
  const failed = settled.find((r) => r.status === 'rejected');
  if (failed !== undefined) {
    await holdingLoopOpen(
      Promise.all(settled.map((r) => (r.status === 'fulfilled' ? r.value.worker.terminate() : undefined))),
    );
    throw failed.reason;
  }
  const threads = settled.map((r) => (r as PromiseFulfilledResult<RankThread>).value);
  return new ThreadedDevice(opts, buffers, threads);
}

interface RankThread {
  worker: Worker;
  progress: SharedArrayBuffer;
  /** Hand the thread's death over to the device: drops the start-up watch and replays a death it saw. */
  adopt(onError: (err: unknown) => void, onExit: (code: number) => void): void;
}

/** One compute thread, ready (its kernel module loaded). */
async function startThread(init: ThreadInit): Promise<Omit<RankThread, 'progress'>> {
  const worker = new Worker(THREAD_ENTRY, { workerData: init });
  let settle: { resolve: () => void; reject: (e: HandoffError) => void } | null = null;
  const started = new Promise<void>((resolve, reject) => (settle = { resolve, reject }));
  const onMessage = (msg: FromThread): void => {
    if (msg.t === 'ready') settle?.resolve();
    else if (msg.t === 'initError')
      settle?.reject(new HandoffError('BAD_CONFIG', `compute thread failed to start: ${msg.message}`));
  };
  const onError = (err: Error): void =>
    settle?.reject(new HandoffError('INTERNAL', `compute thread failed to start: ${err.message}`));
  const onExit = (code: number): void =>
    settle?.reject(new HandoffError('INTERNAL', `compute thread exited during start (code ${code})`));
  worker.on('message', onMessage).on('error', onError).on('exit', onExit);
  try {
    await started;
  } catch (err) {
    await holdingLoopOpen(worker.terminate());
    throw err;
  } finally {
    // Only our own listeners: the Worker keeps internal ones that must stay.
    worker.off('message', onMessage).off('error', onError).off('exit', onExit);
  }
  // Ready, but not yet the device's (other ranks may still be loading): a death now must not be lost, and an
  // 'error' event without a listener would be thrown in the host.
  let died: { err: unknown } | { code: number } | null = null;
  const onEarlyError = (err: unknown): void => void (died ??= { err });
  const onEarlyExit = (code: number): void => void (died ??= { code });
  worker.on('error', onEarlyError).on('exit', onEarlyExit);
  const adopt = (onDeviceError: (err: unknown) => void, onDeviceExit: (code: number) => void): void => {
    worker.off('error', onEarlyError).off('exit', onEarlyExit);
    const d = died as { err: unknown } | { code: number } | null;
    if (d !== null) {
      if ('err' in d) onDeviceError(d.err);
      else onDeviceExit(d.code);
    }
  };
  return { worker, adopt };
}

class ThreadedDevice implements Device, DeviceTimeline {
  readonly kind = 'threaded' as const;
  readonly numSlabs: number;
  readonly numBlocks: number;
  readonly pageBytes: number;
  readonly slabs: Uint8Array[];
  readonly buffers: SharedArrayBuffer[];
  readonly compute: Stream;
  /** One stream per rank (the only one at TP=1, then `compute` itself). */
  readonly rankStreams: ThreadedStream[];
  readonly raceChecker: RaceChecker | null;
  private readonly workers: Worker[];
  private closed = false;
  private readonly lostReason = new Deferred<HandoffError>();
  readonly lost = this.lostReason.promise;

  constructor(opts: ThreadedDeviceOptions, buffers: SharedArrayBuffer[], threads: RankThread[]) {
    this.numSlabs = opts.numSlabs;
    this.numBlocks = opts.numBlocks;
    this.pageBytes = opts.pageBytes;
    this.buffers = buffers;
    this.slabs = buffers.map((b) => new Uint8Array(b));
    const checker = opts.raceCheck === true ? new OpIdRaceChecker() : null;
    this.raceChecker = checker;
    let opSeq = 0;
    let eventSeq = 0;
    const ctx: StreamContext = {
      geometry: { numSlabs: this.numSlabs, numBlocks: this.numBlocks, pageBytes: this.pageBytes },
      checker: this.raceChecker,
      nextOpId: () => ++opSeq,
      nextEventId: () => ++eventSeq,
    };
    this.workers = threads.map((t) => t.worker);
    this.rankStreams = threads.map(({ worker, progress }, rank) => {
      const name = rankStreamName('compute', rank, threads.length);
      const stream = new ThreadedStream(
        name,
        ctx,
        worker,
        new BigInt64Array(progress),
        () => checker?.lastOpId ?? null,
      );
      worker.on('message', (msg: FromThread) => {
        stream.onMessage(msg);
        if (stream.pending() === 0 && !this.closed) worker.unref();
      });
      worker.unref();
      return stream;
    });
    threads.forEach(({ worker, adopt }, rank) => {
      // The thread dying is not an op failure: everything pending fails with the reason.
      // What a thread throws need not be an Error (`throw null` in a kernel module's callback).
      const onError = (err: unknown): void =>
        this.die(`compute thread ${rank} died: ${err instanceof Error ? err.message : String(err)}`);
      const onExit = (code: number): void => this.die(`compute thread ${rank} exited (code ${code})`);
      worker.on('error', onError).on('exit', onExit);
      adopt(onError, onExit);
    });
    this.compute =
      threads.length === 1
        ? (this.rankStreams[0] as ThreadedStream)
        : new RankedStream('compute', ctx, this.rankStreams);
    if (opts.timeline === true) this.startTimeline();
  }

  /** The op log times rank 0's ops (every rank runs every kernel and sleep; zero ops per rank). */
  startTimeline(): void {
    (this.rankStreams[0] as ThreadedStream).timeline ??= new OpTimeline();
  }

  timeline(): TimedOp[] {
    return this.rankStreams[0]?.timeline?.entries() ?? [];
  }

  timelineNowMs(): number {
    return epochNowMs();
  }

  /** The event's own (observed) wait: the host joins it when the caller continues, not before. */
  synchronize(): Promise<void> {
    if (this.terminated) return Promise.reject(new AssertionFailure('synchronize on a closed device'));
    try {
      return this.compute.recordEvent().wait();
      // catch-ok: nothing is swallowed: a lost device's HandoffError (or a bug's AssertionFailure) rejects the promise
    } catch (err) {
      return Promise.reject(err);
    }
  }

  async close(): Promise<void> {
    if (this.terminated) return;
    this.terminated = true;
    this.die('device closed', false);
    // A thread that died already closed the device, not its other ranks' threads: every one is stopped here.
    // The idle thread is unref'd; a terminate awaited on it alone would let the event loop empty first
    // (the process then exits 13 with the caller's promise unsettled, e.g. before an error is printed).
    await holdingLoopOpen(Promise.all(this.workers.map((w) => w.terminate())));
  }

  private terminated = false;

  /** `lost`: a thread died (an operating error for whoever uses the device next), not close(). */
  private die(reason: string, lost = true): void {
    if (this.closed) return;
    this.closed = true;
    const err = new HandoffError('INTERNAL', reason);
    for (const s of this.rankStreams) {
      if (lost) s.lose(err);
      else s.fail(err);
    }
    if (lost) this.lostReason.resolve(err);
  }
}
