/**
 * Messages between the host and the compute stream's thread. Kept small: slabs are shared memory
 * handed over once at start, so an op message carries only block ids and kernel args.
 *
 *   host  --op{seq, op} / wait{seq, token} / signal{token}-->  thread
 *   host  <--ready / initError / done{seq, result} / failed{seq, message}--  thread
 *
 * `seq` numbers the items of the stream (ops and waits) from 1; the thread stores the seq of the last
 * executed item in `progress[0]` before it posts `done`, so the host can query events without a message.
 */
import type { CollectiveInit } from './threaded_collective.ts';
import type { StreamOp } from './types.ts';

export type ToThread =
  /** `timed`: the thread reports the op's start and end (the opt-in op log, threaded_timeline.ts). */
  | { t: 'op'; seq: number; op: StreamOp; timed?: true }
  /** Hold later items until `signal{token}` arrives (a wait on an event from elsewhere). */
  | { t: 'wait'; seq: number; token: number }
  | { t: 'signal'; token: number };

export type FromThread =
  | { t: 'ready' }
  | { t: 'initError'; message: string }
  | ({ t: 'done'; seq: number; result: unknown } & OpTimes)
  | ({ t: 'failed'; seq: number; message: string } & OpTimes);

/** Epoch ms read by the thread around a timed op (absent for untimed ops and waits). */
export interface OpTimes {
  startMs?: number;
  endMs?: number;
}

export interface ThreadInit {
  buffers: SharedArrayBuffer[];
  pageBytes: number;
  /** BigInt64Array(1): seq of the last executed item. */
  progress: SharedArrayBuffer;
  kernelModuleUrl: string | undefined;
  kernelInit: unknown;
  /** This thread's rank; the collective's shared memory when the device has more than one. */
  rank: { rank: number; size: number; collective: CollectiveInit | null };
}

/** The clock both sides read for the op log: epoch ms with sub-ms resolution, shared by every thread. */
export function epochNowMs(): number {
  return performance.timeOrigin + performance.now();
}
