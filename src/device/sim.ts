/**
 * The simulated device: slabs are plain ArrayBuffers in this process, and a stream's ops execute
 * only when the simulator says so. The host code is the same as with the threaded device; what
 * differs is who decides when the stream makes progress:
 *
 *   readyOps()  -> the op at the head of each stream whose waits are satisfied
 *   runOp(id)   -> execute that op now, synchronously, and settle its ticket
 *
 * With tensor parallel ranks (DeviceOptions.tensorParallelSize) each rank has its own stream and
 * `compute` fans out over them (ranked_stream.ts): a zero or copy is one ready op PER RANK (`rank` set,
 * so the simulator can interleave a NIC write between rank 0's zeroing and rank 1's), a kernel is one gang
 * op, ready when it heads every rank's stream, run once over every rank (the kernels compute all ranks in
 * this process: no collective).
 *   runAll()    -> run ready ops in enqueue order until none is ready
 *   autoRun     -> runAll at the next microtask after any change (for simple tests)
 *
 * Deterministic: no timers, no randomness; a `sleep` op only reports its length (`sleepMs`) for the
 * simulator's cost model.
 */
import { assert, defined } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';
import { checkKernels, findKernel, isKernelModule, kernelFailure, loadKernelModule, type Kernels } from './kernels.ts';
import { checkGeometry, copyPages, deviceRanks, zeroPages, zeroSpans } from './page_ops.ts';
import { RaceChecker } from './race/race_checker.ts';
import { eventSource } from './device_event.ts';
import { observed } from './observed_promise.ts';
import { RankedStream, rankStreamName } from './ranked_stream.ts';
import { SimStream, type SimOpItem } from './sim_stream.ts';
import type { StreamContext } from './stream_base.ts';
import type {
  Device,
  DeviceEvent,
  DeviceOptions,
  KernelFn,
  KernelModule,
  KernelRanks,
  OpLabel,
  Stream,
  StreamOp,
} from './types.ts';

export interface SimDeviceOptions extends DeviceOptions {
  raceCheck?: boolean;
  /** In-process kernels (a record, or a module's exports); else `kernelModuleUrl` is imported. */
  kernels?: Record<string, KernelFn> | KernelModule;
  /** Run ready ops at the next microtask after each change; without it only runOp/runAll execute. */
  autoRun?: boolean;
}

export interface SimReadyOp {
  /** The op's id on `compute` (what its observers saw). */
  id: number;
  /** The rank whose part this is (runOp(id, rank)), or null: the whole op (no ranks, or a gang kernel). */
  rank: number | null;
  stream: string;
  label: OpLabel;
  kind: StreamOp['kind'];
  /** The `ms` of a sleep op (the cost model's "long previous forward"), else 0. */
  sleepMs: number;
}

function isThenable(x: unknown): x is PromiseLike<unknown> {
  return typeof x === 'object' && x !== null && typeof (x as { then?: unknown }).then === 'function';
}

export function createSimDevice(opts: SimDeviceOptions): SimDevice {
  return new SimDevice(opts);
}

export class SimDevice implements Device {
  readonly kind = 'sim' as const;
  readonly numSlabs: number;
  readonly numBlocks: number;
  readonly pageBytes: number;
  readonly slabs: Uint8Array[];
  readonly buffers: ArrayBuffer[];
  readonly compute: Stream;
  readonly raceChecker: RaceChecker | null;
  readonly ranks: number;
  /** Settles when the kernels are loaded (at once unless a module loads asynchronously). */
  readonly kernelsLoaded: Promise<void>;
  private kernels: Kernels | null = null;
  private kernelLoadError: unknown = null;
  private readonly streams: SimStream[] = [];
  private readonly autoRun: boolean;
  private autoRunQueued = false;
  private closed = false;

  constructor(opts: SimDeviceOptions) {
    const g = checkGeometry(opts);
    this.numSlabs = g.numSlabs;
    this.numBlocks = g.numBlocks;
    this.pageBytes = g.pageBytes;
    this.buffers = Array.from({ length: g.numSlabs }, () => new ArrayBuffer(g.numBlocks * g.pageBytes));
    this.slabs = this.buffers.map((b) => new Uint8Array(b));
    this.raceChecker = opts.raceCheck === true ? new RaceChecker() : null;
    this.autoRun = opts.autoRun === true;
    let opSeq = 0;
    let eventSeq = 0;
    const ctx: StreamContext = {
      geometry: g,
      checker: this.raceChecker,
      nextOpId: () => ++opSeq,
      nextEventId: () => ++eventSeq,
    };
    this.ranks = deviceRanks(opts);
    for (let r = 0; r < this.ranks; r++)
      this.streams.push(new SimStream(rankStreamName('compute', r, this.ranks), ctx, () => this.queueAutoRun()));
    this.compute = this.ranks === 1 ? (this.streams[0] as SimStream) : new RankedStream('compute', ctx, this.streams);
    this.kernelsLoaded = this.loadKernels(opts);
    // catch-ok: only marks the rejection handled; every kernel op then fails its ticket with kernelLoadError
    this.kernelsLoaded.catch(() => {});
  }

  /** The head op of each stream whose waits are satisfied, in stream order (a gang once, when it heads all). */
  readyOps(): SimReadyOp[] {
    this.settle();
    const out: SimReadyOp[] = [];
    this.streams.forEach((s, rank) => {
      const item = s.head();
      if (item === null) return;
      const op = item.sub.op;
      if (op.kind === 'kernel' && this.kernels === null && this.kernelLoadError === null) return;
      const ready = (id: number, r: number | null): SimReadyOp => ({
        id,
        rank: r,
        stream: s.name,
        label: item.sub.label,
        kind: op.kind,
        sleepMs: op.kind === 'sleep' ? op.ms : 0,
      });
      if (item.link === null) out.push(ready(item.id, null));
      else if (!item.link.gang) out.push(ready(item.link.parent, rank));
      else if (rank === 0 && this.gangHeads(item.link.parent) !== null) out.push(ready(item.link.parent, null));
    });
    return out;
  }

  /** Every rank's part of gang `parent` when it heads every rank's stream, else null. */
  private gangHeads(parent: number): SimOpItem[] | null {
    const heads = this.streams.map((s) => s.head());
    return heads.every((h) => h !== null && h.link?.parent === parent) ? (heads as SimOpItem[]) : null;
  }

  /** Execute ready op `id` (rank `rank`'s part of it, when readyOps said so) now and settle its ticket. */
  runOp(id: number, rank: number | null = null): void {
    assert(!this.closed, 'runOp on a closed device');
    const ready = this.readyOps().find((r) => r.id === id && r.rank === rank);
    assert(ready !== undefined, `op ${id}${rank === null ? '' : ` (rank ${rank})`} is not ready`);
    const gang = this.ranks > 1 && rank === null ? this.gangHeads(id) : null;
    const stream = this.streams.find((s) => s.name === ready.stream);
    assert(stream !== undefined, `stream '${ready.stream}' missing`);
    const items = gang ?? [defined(stream.head(), 'ready op at the head')];
    const streamOf = (i: number): SimStream => (gang === null ? stream : (this.streams[i] as SimStream));
    const taken = items.map((it, i) => streamOf(i).takeHead(it.id));
    const first = taken[0] as SimOpItem;
    const finish = (ok: boolean): void => {
      for (const it of taken.slice(1)) it.result.resolve(undefined);
      this.settle();
      // The tickets' continuations run in a later microtask: observers hear of the op first.
      taken.forEach((it, i) => streamOf(i).executed(it.id, ok));
    };
    const outcome = this.execute(first);
    if (typeof outcome === 'boolean') return finish(outcome);
    // A kernel's promise holds its streams until it settles, as the threaded device's thread holds for it.
    const hold = (running: boolean): void => taken.forEach((_, i) => (streamOf(i).running = running));
    hold(true);
    const settled = (ok: boolean): void => {
      hold(false);
      finish(ok);
      this.queueAutoRun();
    };
    Promise.resolve(outcome).then(
      (value) => {
        first.result.resolve(value);
        settled(true);
      },
      (err: unknown) => {
        first.result.reject(this.kernelError(first, err));
        settled(false);
      },
    );
  }

  private kernelError(item: SimOpItem, err: unknown): HandoffError {
    const name = item.sub.op.kind === 'kernel' ? item.sub.op.name : item.sub.op.kind;
    return new HandoffError('INTERNAL', kernelFailure(name, err), { kernel: name });
  }

  /**
   * Run one op on the slabs (a gang kernel computes every rank) and settle its ticket; false if it failed.
   * A kernel that returns a promise: that promise, the ticket left for the caller to settle.
   */
  private execute(item: SimOpItem): boolean | PromiseLike<unknown> {
    const op = item.sub.op;
    switch (op.kind) {
      case 'zero':
        zeroPages(this.slabs, this.pageBytes, op.blockIds, op.slabs);
        break;
      case 'zero-spans':
        zeroSpans(this.slabs, this.pageBytes, op.spans);
        item.result.resolve(undefined);
        break;
      case 'copy':
        copyPages(this.slabs, this.pageBytes, op.pairs, op.slabs);
        break;
      case 'sleep':
        break;
      case 'kernel':
        try {
          if (this.kernels === null) throw this.kernelLoadError;
          const value = findKernel(this.kernels, op.name)(op.args, this.slabs);
          if (isThenable(value)) return value;
          item.result.resolve(value);
          return true;
          // catch-ok: a failing kernel is a device error: it fails its own op ticket with the message (like a CUDA
          // error), the stream goes on
        } catch (err) {
          // A failing kernel rejects only its own ticket; the stream goes on.
          item.result.reject(this.kernelError(item, err));
          return false;
        }
    }
    item.result.resolve(undefined);
    return true;
  }

  /** Run ready ops, lowest id first, until none is ready. Returns how many ran. */
  runAll(): number {
    let ran = 0;
    while (!this.closed) {
      const ready = this.readyOps();
      if (ready.length === 0) break;
      const next = ready.reduce((a, b) => (b.id < a.id || (b.id === a.id && (b.rank ?? 0) < (a.rank ?? 0)) ? b : a));
      this.runOp(next.id, next.rank);
      ran++;
    }
    return ran;
  }

  /** Items (ops, records, waits) queued on every stream and not yet consumed. */
  pendingItems(): number {
    return this.streams.reduce((n, s) => n + s.pending(), 0);
  }

  synchronize(): Promise<void> {
    let events: DeviceEvent[];
    try {
      assert(!this.closed, 'synchronize on a closed device');
      events = this.streams.map((s) => s.recordEvent());
    } catch (e) {
      return Promise.reject(e);
    }
    // The host waits for the events when host code continues after synchronize(), not when Promise.all's
    // own continuation sees each one reached (observed_promise.ts).
    const checker = this.raceChecker;
    const reached = Promise.all(events.map((e) => eventSource(e).reached)).then(() => undefined);
    return observed(reached, () => {
      for (const e of events) {
        const id = checker?.eventIdOf(e);
        if (checker !== null && id !== undefined) checker.hostWaitEvent(id);
      }
    });
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const err = new HandoffError('INTERNAL', 'device closed');
    for (const s of this.streams) s.fail(err);
  }

  private settle(): void {
    // Reaching an event on one stream may release a wait on another: repeat to a fixpoint. Each
    // round consumes at least one item, so this ends.
    let changed = true;
    while (changed) {
      changed = false;
      for (const s of this.streams) changed = s.settle() || changed;
    }
  }

  private queueAutoRun(): void {
    if (!this.autoRun || this.autoRunQueued || this.closed) return;
    this.autoRunQueued = true;
    queueMicrotask(() => {
      this.autoRunQueued = false;
      this.runAll();
    });
  }

  private loadKernels(opts: SimDeviceOptions): Promise<void> {
    const init = opts.kernelInit;
    // Every rank is computed here, by one kernel call: no collective.
    const ranks: KernelRanks = { size: this.ranks, ranks: this.streams.map((_, r) => r), collective: null };
    let pending: Promise<Kernels> | null = null;
    if (opts.kernels !== undefined && isKernelModule(opts.kernels)) {
      const made = opts.kernels.createKernels(init, this.slabs, ranks);
      if (made instanceof Promise) pending = made.then((k) => checkKernels(k, 'kernels option'));
      else this.kernels = checkKernels(made, 'kernels option');
    } else if (opts.kernels !== undefined) {
      this.kernels = checkKernels(opts.kernels, 'kernels option');
    } else if (opts.kernelModuleUrl !== undefined) {
      pending = loadKernelModule(opts.kernelModuleUrl, init, this.slabs, ranks);
    } else {
      this.kernels = {};
    }
    if (pending === null) return Promise.resolve();
    return pending.then(
      (k) => {
        this.kernels = k;
        this.queueAutoRun();
      },
      (err: unknown) => {
        this.kernelLoadError = err;
        this.queueAutoRun();
        throw err;
      },
    );
  }
}
