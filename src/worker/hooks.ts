/**
 * The hook interface the model runner calls and the connector's worker side implements (the runner is
 * below the connector, so it defines the interface; DESIGN.md §2).
 *
 * Per step: updateRequests (zeroing enqueued) → preForward (post loads; every READ of the step is awaited
 * before it returns) → forward enqueued → postForward (connector results for this step).
 */
import type { KVConnectorOutput, SchedulerOutput } from './scheduler_output.ts';

export interface LoadResult {
  /** Requests whose load failed this step: they are left out of the forward. */
  failedReqIds: string[];
  /** Their destination pages (the scheduler re-zeroes or fails them). */
  invalidBlockIds: number[];
  /** Why each failed (code + message, plain data): client-caused codes fail the request with a 4xx. */
  loadErrors: Record<string, LoadErrorData>;
}

export interface LoadErrorData {
  code: string;
  message: string;
}

export interface ConnectorWorkerHooks {
  /** Before the step's forward is enqueued. Must not return before every READ of the step has landed or failed. */
  preForward(so: SchedulerOutput): Promise<LoadResult>;
  /** After the step's forward finished: finished sends/receives for the scheduler. */
  postForward(so: SchedulerOutput): Promise<KVConnectorOutput>;
  /** True while transfers are outstanding. */
  hasPendingWork(): boolean;
  /** The engine is closing: preForward stops waiting for loads (those in flight are aborted, then fail). */
  abandonLoads?(): void;
  /** False only under the bug zoo's `zero-after-loads`: the step's zeroing is queued after its loads. */
  readonly zeroBeforeLoads?: boolean;
}
