/**
 * Failures met while applying a step's results, for the scheduler:
 * - load failures: async loads whose WRITE never arrived, and running requests whose synchronous READ
 *   failed or left invalid pages. Each recomputes from its last good page, or fails (kvLoadFailurePolicy
 *   'fail', or a client fault in its kv_transfer_params);
 * - forward failures: a request's forward failed on the device (failForward).
 */
import { defined } from '../util/assert.ts';
import { HandoffError, type ErrorCode } from '../util/errors.ts';
import type { KVCacheManager } from '../kv/kv_cache_manager.ts';
import type { RequestTransfers } from './request_transfers.ts';
import type { SchedulerConfig } from './scheduler_config.ts';
import { nextEpoch, type Request, type RequestStatus } from './request.ts';
import type { SchedulerOutput } from '../worker/scheduler_output.ts';
import type { TakenStep } from './inflight_steps.ts';

/** Load failures caused by the request's own kv_transfer_params: always an error to the client. */
export const CLIENT_FAULT_CODES = new Set(['GRANT_DENIED', 'BAD_TRANSFER_PARAMS', 'PEER_INCOMPATIBLE']);

/** What the scheduler lends to the failure handling. */
export interface StepFailureHost {
  readonly requests: ReadonlyMap<string, Request>;
  readonly kv: KVCacheManager;
  readonly config: SchedulerConfig;
  readonly transfers: RequestTransfers;
  /** Counts one failed load (stats.loadFailures). */
  countFailure(): void;
  finish(req: Request, status: RequestStatus): void;
  abortRequest(requestId: string, status: RequestStatus, error: HandoffError): boolean;
  /** A running request rolled back for recompute: out of the batch, preempted, first in the queue. */
  requeue(req: Request): void;
}

function blockSizeOf(host: StepFailureHost): number {
  return defined(host.kv.config.groups[0], 'group 0').spec.blockSize;
}

function failLoad(host: StepFailureHost, req: Request): void {
  req.error = new HandoffError('KV_LOAD_FAILED', `KV load for request ${req.requestId} failed`);
  host.finish(req, 'FINISHED_ERROR');
}

/**
 * A load rolled back to `start` for recompute: only the external tokens before `start` (they follow the
 * local hit) still came from the peer. Before session 19 the count kept the whole load, so a request whose
 * load failed and was recomputed here still reported its tokens as loaded (`numExternalTokens`), which
 * tests take as the proof that KV crossed from prefill.
 */
function keepExternalBelow(req: Request, start: number): void {
  req.numExternalComputedTokens = Math.max(0, Math.min(req.numExternalComputedTokens, start - req.numLocalHitTokens));
}

/**
 * Async loads that failed (a WRITE that never arrived, an async READ that failed): a client fault fails
 * with its code; otherwise recompute from the local hit, or fail.
 */
export function failAsyncLoads(
  host: StepFailureHost,
  waiting: readonly Request[],
  failed: Set<string>,
  loadErrors: Record<string, { code: string; message: string }> = {},
): void {
  const bs = blockSizeOf(host);
  for (const req of waiting.filter((r) => r.status === 'WAITING_FOR_REMOTE_KVS' && failed.has(r.requestId))) {
    host.countFailure();
    const cause = loadErrors[req.requestId];
    if (cause && CLIENT_FAULT_CODES.has(cause.code)) {
      req.error = new HandoffError(cause.code as ErrorCode, `kv_transfer_params rejected: ${cause.message}`);
      host.finish(req, 'FINISHED_ERROR');
      continue;
    }
    if (host.config.kvLoadFailurePolicy === 'fail') {
      failLoad(host, req);
      continue;
    }
    const start = Math.floor(req.numLocalHitTokens / bs) * bs;
    host.kv.recordBlocksForZeroing(req.requestId, start);
    req.numComputedTokens = start;
    keepExternalBelow(req, start);
    req.status = 'PREEMPTED';
    host.transfers.dropLoad(req.requestId);
  }
}

/**
 * Running requests of this step whose load failed or that hold invalid pages: a client fault fails with
 * its code, otherwise recompute from the first bad page (or fail, by policy). Adds them to `failed`.
 */
export function failRunningLoads(
  host: StepFailureHost,
  running: readonly Request[],
  invalid: Set<number>,
  failed: Set<string>,
  epochs: Map<string, number>,
  loadErrors: Record<string, { code: string; message: string }>,
): void {
  const bs = blockSizeOf(host);
  for (const req of running) {
    if (epochs.get(req.requestId) !== req.epoch) continue;
    const blocks = host.kv.getBlockIds(req.requestId);
    // A failed request without page detail: every loaded page is suspect, from the first external page.
    let firstBad = failed.has(req.requestId) ? Math.floor(req.numLocalHitTokens / bs) : Infinity;
    for (const g of blocks) g.forEach((b, idx) => invalid.has(b) && (firstBad = Math.min(firstBad, idx)));
    if (firstBad === Infinity) continue;
    host.countFailure();
    failed.add(req.requestId);
    const cause = loadErrors[req.requestId];
    if (cause && CLIENT_FAULT_CODES.has(cause.code)) {
      // The params were bad (forged grant, unknown engine...): the client gets a 4xx, no silent recompute.
      req.error = new HandoffError(cause.code as ErrorCode, `kv_transfer_params rejected: ${cause.message}`);
      host.finish(req, 'FINISHED_ERROR');
      continue;
    }
    if (host.config.kvLoadFailurePolicy === 'fail') {
      failLoad(host, req);
      continue;
    }
    // Recompute: truncate to the first invalid page, re-zero the pages from there, rebuild on the worker.
    const startToken = Math.min(firstBad * bs, Math.floor((req.numTokens - 1) / bs) * bs);
    host.kv.recordBlocksForZeroing(req.requestId, startToken);
    req.numComputedTokens = startToken;
    keepExternalBelow(req, startToken);
    req.numOutputPlaceholders = 0;
    req.epoch = nextEpoch();
    host.requeue(req);
  }
}

/**
 * A request's forward failed on the device: it fails alone with a 500. The pages its step wrote are
 * withdrawn from the prefix cache, and requests that already hit them (their KV is not valid) fail too.
 */
export function failForward(
  host: StepFailureHost,
  so: SchedulerOutput,
  requestId: string,
  message: string,
  step: TakenStep,
): void {
  const req = host.requests.get(requestId);
  if (!req || req.isFinished || step.epochs.get(requestId) !== req.epoch) {
    // It left while the step ran (aborted, preempted): the pages the step published are still withdrawn.
    failHolders(host, host.kv.uncacheBlockIds(step.writtenFrom(requestId)), requestId, message);
    return;
  }
  const data =
    so.scheduledNewReqs.find((n) => n.requestId === requestId) ??
    so.scheduledCachedReqs.find((c) => c.requestId === requestId);
  const holders = host.kv.uncacheFrom(requestId, data?.numComputedTokens ?? 0);
  req.error = new HandoffError('INTERNAL', `the model failed on this request: ${message}`);
  host.finish(req, 'FINISHED_ERROR');
  failHolders(host, holders, requestId, message);
}

/**
 * Requests that hit withdrawn pages fail. The pages each computed past its hit were computed over that
 * never-computed prefix: they are withdrawn too, and the requests that hit those fail in turn.
 */
function failHolders(host: StepFailureHost, holders: string[], requestId: string, message: string): void {
  const seen = new Set(holders);
  // Bounded: each request joins once.
  for (let i = 0; i < holders.length; i++) {
    const id = holders[i] as string;
    const hit = host.requests.get(id)?.numLocalHitTokens ?? 0;
    for (const more of host.kv.uncacheFrom(id, hit)) if (!seen.has(more)) (seen.add(more), holders.push(more));
  }
  const shared = `a prefix this request shared with ${requestId} was never computed: ${message}`;
  for (const id of holders) host.abortRequest(id, 'FINISHED_ERROR', new HandoffError('INTERNAL', shared));
}
