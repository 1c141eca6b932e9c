/**
 * The simulated device: slabs are plain ArrayBuffers in this process, and a stream's ops execute
 * only when the simulator says so. The host code is the same as with the threaded device; what
 * differs is who decides when the stream makes progress:
 *
 *   readyOps()  -> the op at the head of each stream whose waits are satisfied
 *   runOp(id)   -> execute that op now, synchronously, and settle its ticket
 *   runAll()    -> run ready ops in enqueue order until none is ready
 *   autoRun     -> runAll at the next microtask after any change (for simple tests)
 *
 * Deterministic: no timers, no randomness; a `sleep` op only reports its length (`sleepMs`) for the
 * simulator's cost model.
 */
import { assert } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';
import { checkKernels, findKernel, isKernelModule, kernelFailure, loadKernelModule, type Kernels } from './kernels.ts';
import { checkGeometry, copyPages, zeroPages, zeroSpans } from './page_ops.ts';
import { RaceChecker } from './race/race_checker.ts';
import { SimStream } from './sim_stream.ts';
import type { StreamContext } from './stream_base.ts';
import type { Device, DeviceOptions, KernelFn, KernelModule, OpLabel, StreamOp } from './types.ts';

export interface SimDeviceOptions extends DeviceOptions {
  raceCheck?: boolean;
  /** In-process kernels (a record, or a module's exports); else `kernelModuleUrl` is imported. */
  kernels?: Record<string, KernelFn> | KernelModule;
  /** Run ready ops at the next microtask after each change; without it only runOp/runAll execute. */
  autoRun?: boolean;
}

export interface SimReadyOp {
  id: number;
  stream: string;
  label: OpLabel;
  kind: StreamOp['kind'];
  /** The `ms` of a sleep op (the cost model's "long previous forward"), else 0. */
  sleepMs: number;
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
  readonly compute: SimStream;
  readonly raceChecker: RaceChecker | null;
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
    this.compute = new SimStream('compute', ctx, () => this.queueAutoRun());
    this.streams.push(this.compute);
    this.kernelsLoaded = this.loadKernels(opts);
    // catch-ok: only marks the rejection handled; every kernel op then fails its ticket with kernelLoadError
    this.kernelsLoaded.catch(() => {});
  }

  /** The head op of each stream whose waits are satisfied, in stream order. */
  readyOps(): SimReadyOp[] {
    this.settle();
    const out: SimReadyOp[] = [];
    for (const s of this.streams) {
      const item = s.head();
      if (item === null) continue;
      const op = item.sub.op;
      if (op.kind === 'kernel' && this.kernels === null && this.kernelLoadError === null) continue;
      out.push({
        id: item.id,
        stream: s.name,
        label: item.sub.label,
        kind: op.kind,
        sleepMs: op.kind === 'sleep' ? op.ms : 0,
      });
    }
    return out;
  }

  /** Execute ready op `id` now and settle its ticket (the continuation runs in a later microtask). */
  runOp(id: number): void {
    assert(!this.closed, 'runOp on a closed device');
    const ready = this.readyOps().find((r) => r.id === id);
    assert(ready !== undefined, `op ${id} is not ready`);
    const stream = this.streams.find((s) => s.name === ready.stream);
    assert(stream !== undefined, `stream '${ready.stream}' missing`);
    const item = stream.takeHead(id);
    const op = item.sub.op;
    let ok = true;
    switch (op.kind) {
      case 'zero':
        zeroPages(this.slabs, this.pageBytes, op.blockIds, op.slabs);
        item.result.resolve(undefined);
        break;
      case 'zero-spans':
        zeroSpans(this.slabs, this.pageBytes, op.spans);
        item.result.resolve(undefined);
        break;
      case 'copy':
        copyPages(this.slabs, this.pageBytes, op.pairs, op.slabs);
        item.result.resolve(undefined);
        break;
      case 'sleep':
        item.result.resolve(undefined);
        break;
      case 'kernel':
        try {
          if (this.kernels === null) throw this.kernelLoadError;
          item.result.resolve(findKernel(this.kernels, op.name)(op.args, this.slabs));
          // catch-ok: a failing kernel is a device error: it fails its own op ticket with the message (like a CUDA
          // error), the stream goes on
        } catch (err) {
          // A failing kernel rejects only its own ticket; the stream goes on.
          ok = false;
          item.result.reject(new HandoffError('INTERNAL', kernelFailure(op.name, err), { kernel: op.name }));
        }
        break;
    }
    this.settle();
    // The ticket's continuations run in a later microtask: observers hear of the op first.
    stream.executed(id, ok);
  }

  /** Run ready ops, lowest id first, until none is ready. Returns how many ran. */
  runAll(): number {
    let ran = 0;
    while (!this.closed) {
      const ready = this.readyOps();
      if (ready.length === 0) break;
      const next = ready.reduce((a, b) => (b.id < a.id ? b : a));
      this.runOp(next.id);
      ran++;
    }
    return ran;
  }

  /** Items (ops, records, waits) queued on every stream and not yet consumed. */
  pendingItems(): number {
    return this.streams.reduce((n, s) => n + s.pending(), 0);
  }

  async synchronize(): Promise<void> {
    assert(!this.closed, 'synchronize on a closed device');
    const events = this.streams.map((s) => s.recordEvent());
    await Promise.all(events.map((e) => e.wait()));
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
    let pending: Promise<Kernels> | null = null;
    if (opts.kernels !== undefined && isKernelModule(opts.kernels)) {
      const made = opts.kernels.createKernels(init, this.slabs);
      if (made instanceof Promise) pending = made.then((k) => checkKernels(k, 'kernels option'));
      else this.kernels = checkKernels(made, 'kernels option');
    } else if (opts.kernels !== undefined) {
      this.kernels = checkKernels(opts.kernels, 'kernels option');
    } else if (opts.kernelModuleUrl !== undefined) {
      pending = loadKernelModule(opts.kernelModuleUrl, init, this.slabs);
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
