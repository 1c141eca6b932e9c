/**
 * The Device: the memory the KV cache lives in (slabs), a compute stream that executes ops in FIFO
 * order while the host goes on, events, and the NIC's accesses as one more agent for the race checker.
 *
 *   host (engine thread) --enqueue--> [ compute stream: op op op ... ]   (FIFO, never waits on the NIC)
 *          \--post------> [ NIC: one-sided READ/WRITE work requests ]   (src/transfer, never waits on the stream)
 *   host waits only on events (a recorded event, an op's completion, a NIC completion).
 *
 * Every op declares its footprint: the (slab, block, byte range) it reads and writes, so the race
 * checker can order accesses by happens-before, not by the timing of one run.
 *
 * Implementations: `threaded` (slabs are SharedArrayBuffers, the stream is a worker thread) and `sim`
 * (the stream is a queue whose progress the simulator chooses). Host code is the same for both.
 */
import type { HandoffError } from '../util/errors.ts';

/** A byte range inside one page: [start, end) relative to the page start. */
export interface PageAccess {
  slab: number;
  block: number;
  start: number;
  end: number;
  write: boolean;
  /**
   * A read of a recurrent state the op then rewrites (Mamba): it sees the bytes from before the op, not
   * the op's own writes. Set on reads only.
   */
  state?: true;
}

/** A byte range inside one page of one slab (an access without its direction). */
export type PageSpan = Omit<PageAccess, 'write'>;

/** What an op is about, for reports: which requests and which engine step. */
export interface OpLabel {
  what: string;
  requestIds?: string[];
  step?: number;
}

/** Ops a compute stream executes. Plain data: they cross a thread boundary. */
export type StreamOp =
  /** Zero whole pages `blockIds` in each of `slabs`. */
  | { kind: 'zero'; blockIds: number[]; slabs: number[] }
  /** Zero byte ranges inside pages (a page a transfer filled only partly: its clipped tail). */
  | { kind: 'zero-spans'; spans: PageSpan[] }
  /** Copy whole pages src -> dst in each of `slabs` (copy-on-write). */
  | { kind: 'copy'; pairs: Array<[src: number, dst: number]>; slabs: number[] }
  /** Keep the stream busy for `ms` (tests and the cost model: a long previous forward). */
  | { kind: 'sleep'; ms: number }
  /** Run a named kernel from the device's kernel module (e.g. the model forward). */
  | { kind: 'kernel'; name: string; args: unknown };

export interface OpSubmission {
  op: StreamOp;
  label: OpLabel;
  /** Declared accesses. For zero/copy the device derives them; kernels must declare theirs. */
  footprint?: PageAccess[];
}

export interface OpTicket {
  id: number;
  /** Resolves with the op's result when it has executed (a host wait on the op's completion). */
  done: Promise<unknown>;
}

export interface DeviceEvent {
  id: number;
  /** Host waits until every op enqueued on the stream before the record has executed. */
  wait(): Promise<void>;
  /** True once it has been reached (non-blocking). */
  query(): boolean;
}

export interface Stream {
  readonly name: string;
  /** Enqueue and return at once; the op runs after every op enqueued before it on this stream. */
  enqueue(sub: OpSubmission): OpTicket;
  /** An event that is reached when everything enqueued so far has executed. */
  recordEvent(): DeviceEvent;
  /** Later ops on this stream wait until `ev` is reached (a stream-side wait; the host goes on). */
  waitEvent(ev: DeviceEvent): void;
  /** Report every op enqueued and executed from now on to `o` (observe, never change). Returns unsubscribe. */
  observe(o: StreamObserver): () => void;
}

/**
 * Watches a stream's ops (oracles: the page lifecycle). Called synchronously by the stream, so an
 * observer must not enqueue, wait, or throw anything but an AssertionFailure.
 */
export interface StreamObserver {
  /** Op `opId` was validated and queued (called before enqueue returns; it cannot have executed yet). */
  enqueued(sub: OpSubmission, opId: number): void;
  /**
   * Op `opId` has executed (`ok` false: it failed, e.g. a kernel error), reported before its ticket's
   * continuations run. On the threaded device this is when the host learns it, not when the thread ran it.
   * An op dropped by a closing stream never executes and is not reported.
   */
  executed(opId: number, ok: boolean): void;
}

/**
 * A kernel module is loaded by path inside the stream's executor (a worker thread for `threaded`),
 * so the device layer never imports the model. It exports `createKernels(init, slabs, ranks)`.
 */
export type KernelFn = (args: unknown, slabs: Uint8Array[]) => unknown;
export interface KernelModule {
  createKernels(
    init: unknown,
    slabs: Uint8Array[],
    ranks?: KernelRanks,
  ): Record<string, KernelFn> | Promise<Record<string, KernelFn>>;
}

/**
 * The ranks a kernel module's executor computes (DeviceOptions.tensorParallelSize). A `threaded` device
 * runs one executor per rank (`ranks: [r]`), joined by a collective over shared memory; the `sim` device
 * runs every rank in one executor (`ranks: [0 .. size-1]`, no collective). Slabs are always the device's
 * (every rank's); rank r owns slabs [r * numSlabs / size, (r + 1) * numSlabs / size).
 */
export interface KernelRanks {
  size: number;
  ranks: number[];
  collective: RankCollective | null;
}

/**
 * What the ranks of one device share while a kernel runs on each of them (src/device/threaded_collective.ts).
 * Every rank calls the same sequence of allGathers with the same lengths.
 */
export interface RankCollective {
  readonly rank: number;
  readonly size: number;
  /** out = rank 0's `local`, then rank 1's, ...: the same bytes on every rank (out.length = size * local.length). */
  allGather(local: Float64Array, out: Float64Array): void;
  /** This rank gave up on the current unit of work: ranks waiting in (or entering) allGather throw instead. */
  abort(): void;
  /** Barrier closing a unit of work: true on every rank when any rank failed or aborted it. */
  agree(failed: boolean): boolean;
}

export interface DeviceOptions {
  numSlabs: number;
  numBlocks: number;
  pageBytes: number;
  /** Absolute file URL of a module exporting createKernels; optional when no kernel op is used. */
  kernelModuleUrl?: string;
  /** Plain data handed to createKernels (e.g. model preset and seed). */
  kernelInit?: unknown;
  /**
   * Ranks (tensor parallelism; default 1): each has its own compute stream and owns numSlabs / ranks
   * consecutive slabs. Ops on `compute` are fanned out to every rank's stream: zero/copy to the ranks
   * owning their slabs, kernels to all (gang: each rank runs the kernel on its share), sleeps to all.
   */
  tensorParallelSize?: number;
}

export interface Device {
  readonly kind: 'threaded' | 'sim';
  readonly numSlabs: number;
  readonly numBlocks: number;
  readonly pageBytes: number;
  /** Slab views; in `threaded` these are SharedArrayBuffer-backed and visible to every thread. */
  readonly slabs: Uint8Array[];
  /** The underlying buffers (SharedArrayBuffer for threaded), for registration with a NIC. */
  readonly buffers: ArrayBufferLike[];
  readonly compute: Stream;
  /** Race checker, when enabled; the NIC reports its accesses here as well. */
  readonly raceChecker: RaceCheckerLike | null;
  /** Host waits for everything enqueued so far on every stream. */
  synchronize(): Promise<void>;
  close(): Promise<void>;
  /**
   * Resolves with the reason when the device is lost on its own (a compute thread died; never after close()):
   * every stream then fails what is pending and refuses new items with that error. Absent: it cannot be lost.
   */
  readonly lost?: Promise<HandoffError>;
}

/** The part of the race checker a NIC (src/transfer) talks to. */
export interface RaceCheckerLike {
  /**
   * The host posts a NIC work request; returns its id. The NIC's access happens-after everything the host did so far.
   */
  nicPost(label: OpLabel, footprint: PageAccess[]): number;
  /** The host observed the work request's completion (poll/wait): the host now happens-after it. */
  nicObserved(wrId: number): void;
}
