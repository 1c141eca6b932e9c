/**
 * The compute stream's thread: executes items strictly in the order they arrive, one at a time,
 * while the host goes on. zero/copy write the shared slabs directly; sleep blocks this thread (it
 * holds the stream, like a long forward); kernel calls the kernel module loaded once at start.
 *
 * A `wait` item holds everything behind it until the host signals its token. A kernel that throws
 * fails only its own item; the thread goes on. With tensor parallel ranks every kernel is a gang: each rank
 * ends it in the collective's fence, and one whose kernel threw leaves the op first, so the other ranks stop
 * waiting for it (a rank failing alone fails the op at once on all of them, not after their 60 s bounds).
 */
import { parentPort, workerData } from 'node:worker_threads';
import { assert } from '../util/assert.ts';
import { findKernel, kernelFailure, loadKernelModule, type Kernels } from './kernels.ts';
import { copyPages, zeroPages, zeroSpans } from './page_ops.ts';
import { SharedMemoryCollective } from './threaded_collective.ts';
import { epochNowMs, type FromThread, type OpTimes, type ThreadInit, type ToThread } from './threaded_protocol.ts';
import type { StreamOp } from './types.ts';

type Item = Exclude<ToThread, { t: 'signal' }>;

const port = parentPort;
assert(port !== null, 'threaded_worker must run in a worker thread');
const init = workerData as ThreadInit;
const slabs = init.buffers.map((b) => new Uint8Array(b));
const progress = new BigInt64Array(init.progress);
const sleepCell = new Int32Array(new SharedArrayBuffer(4));

let kernels: Kernels = {};
/** This rank's end of the ranks' collective (tensor parallel ranks only). */
let collective: SharedMemoryCollective | null = null;
let queue: Item[] = [];
let head = 0;
const signaled = new Set<number>();
let running = false;

function post(msg: FromThread): void {
  port!.postMessage(msg);
}

const UNTIMED: OpTimes = {};

function finish(seq: number, result: unknown, times: OpTimes = UNTIMED): void {
  Atomics.store(progress, 0, BigInt(seq));
  try {
    post({ t: 'done', seq, result, ...times });
    // catch-ok: only postMessage runs in the try: its DataCloneError fails the op
  } catch (err) {
    // A result that cannot cross the thread boundary fails the op, not the thread.
    post({ t: 'failed', seq, message: `op result cannot be sent to the host: ${(err as Error).message}`, ...times });
  }
}

function fail(seq: number, message: string, times: OpTimes): void {
  Atomics.store(progress, 0, BigInt(seq));
  post({ t: 'failed', seq, message, ...times });
}

function isThenable(x: unknown): x is PromiseLike<unknown> {
  return typeof x === 'object' && x !== null && typeof (x as { then?: unknown }).then === 'function';
}

/** Run one op; a kernel may return a promise, which the stream then holds for. */
function execute(op: StreamOp): unknown {
  switch (op.kind) {
    case 'zero':
      zeroPages(slabs, init.pageBytes, op.blockIds, op.slabs);
      return undefined;
    case 'zero-spans':
      zeroSpans(slabs, init.pageBytes, op.spans);
      return undefined;
    case 'copy':
      copyPages(slabs, init.pageBytes, op.pairs, op.slabs);
      return undefined;
    case 'sleep':
      if (op.ms > 0) Atomics.wait(sleepCell, 0, 0, op.ms);
      return undefined;
    case 'kernel':
      return findKernel(kernels, op.name)(op.args, slabs);
  }
}

async function pump(): Promise<void> {
  if (running) return;
  running = true;
  while (head < queue.length) {
    const item = queue[head];
    assert(item !== undefined, 'stream queue hole');
    if (item.t === 'wait') {
      if (!signaled.delete(item.token)) break;
      head++;
      finish(item.seq, undefined);
      continue;
    }
    head++;
    if (head > 4096 && head * 2 > queue.length) {
      queue = queue.slice(head);
      head = 0;
    }
    // The op log's clock is read only for timed ops: tracing off costs one property check.
    const startMs = item.timed === true ? epochNowMs() : -1;
    const times = (): OpTimes => (startMs < 0 ? UNTIMED : { startMs, endMs: epochNowMs() });
    let outcome: { ok: true; result: unknown } | { ok: false; message: string };
    try {
      let result = execute(item.op);
      if (isThenable(result)) result = await result;
      outcome = { ok: true, result };
      // catch-ok: a failing kernel is a device error: it fails its own op with the message (like a CUDA error), the
      // thread goes on
    } catch (err) {
      const message = item.op.kind === 'kernel' ? kernelFailure(item.op.name, err) : (err as Error).message;
      outcome = { ok: false, message };
    }
    if (item.op.kind === 'kernel' && collective !== null) {
      if (!outcome.ok) collective.leave();
      collective.fence();
    }
    if (outcome.ok) finish(item.seq, outcome.result, times());
    else fail(item.seq, outcome.message, times());
  }
  if (head === queue.length) {
    queue = [];
    head = 0;
  }
  running = false;
}

function onMessage(msg: ToThread): void {
  if (msg.t === 'signal') signaled.add(msg.token);
  else queue.push(msg);
  void pump();
}

try {
  if (init.kernelModuleUrl !== undefined) {
    const { rank, size, collective: shared } = init.rank;
    collective = shared === null ? null : new SharedMemoryCollective(shared, rank);
    kernels = await loadKernelModule(init.kernelModuleUrl, init.kernelInit, slabs, { size, ranks: [rank], collective });
  }
  port.on('message', onMessage);
  post({ t: 'ready' });
  // catch-ok: start-up failure of the thread is reported to the host, which fails the device's start with it
} catch (err) {
  post({ t: 'initError', message: err instanceof Error ? err.message : String(err) });
}
