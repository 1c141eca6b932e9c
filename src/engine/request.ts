/**
 * Request: one generation request inside an engine, with its lifecycle state.
 *
 *   WAITING ──schedule──> RUNNING ──stop/length──> FINISHED_STOPPED | FINISHED_LENGTH_CAPPED
 *      │  ▲                 │  └──abort/error──> FINISHED_ABORTED | FINISHED_ERROR
 *      │  └──resume── PREEMPTED <──preempt (out of pages)
 *      └──async load──> WAITING_FOR_REMOTE_KVS ──finishedRecving──> WAITING
 *
 * With async scheduling the scheduler runs a step ahead of the worker: `numOutputPlaceholders` counts
 * tokens scheduled to be sampled but not yet seen, and `numComputedTokens` already includes the
 * tokens of in-flight steps. `epoch` changes when the request is preempted or rolled back, so outputs
 * of steps scheduled before that are recognised as stale and dropped.
 */
import { assert } from '../util/assert.ts';
import type { HandoffError } from '../util/errors.ts';
import type { KVTransferParams } from '../connector/params.ts';
import type { SamplingParamsData } from '../worker/scheduler_output.ts';

export type RequestStatus =
  | 'WAITING'
  | 'WAITING_FOR_REMOTE_KVS'
  | 'RUNNING'
  | 'PREEMPTED'
  | 'FINISHED_STOPPED'
  | 'FINISHED_LENGTH_CAPPED'
  | 'FINISHED_ABORTED'
  | 'FINISHED_ERROR';

export type FinishReason = 'stop' | 'length' | 'abort' | 'error';

let lastEpoch = 0;

/**
 * A fresh epoch, never given before in this process. A step's outputs are matched to the request by (id,
 * epoch); epochs unique across requests keep a stale output of an aborted request from matching a new
 * request that reuses its id (with epochs counted from 0 per request it did, and crashed the engine loop).
 */
export function nextEpoch(): number {
  return ++lastEpoch;
}

/** The status a request stops with once `tokenId` was appended, or null to go on. */
export function stopStatusAfter(
  req: Request,
  tokenId: number,
  c: { eosTokenId: number; maxModelLen: number },
): RequestStatus | null {
  if (!req.sampling.ignoreEos && tokenId === c.eosTokenId) return 'FINISHED_STOPPED';
  if (req.sampling.stopTokenIds.includes(tokenId)) return 'FINISHED_STOPPED';
  if (req.outputTokenIds.length >= req.sampling.maxTokens) return 'FINISHED_LENGTH_CAPPED';
  if (req.numTokens >= c.maxModelLen) return 'FINISHED_LENGTH_CAPPED';
  return null;
}

export function isFinished(status: RequestStatus): boolean {
  return status.startsWith('FINISHED_');
}

export function finishReasonOf(status: RequestStatus): FinishReason | null {
  switch (status) {
    case 'FINISHED_STOPPED':
      return 'stop';
    case 'FINISHED_LENGTH_CAPPED':
      return 'length';
    case 'FINISHED_ABORTED':
      return 'abort';
    case 'FINISHED_ERROR':
      return 'error';
    default:
      return null;
  }
}

/**
 * Whether another live request names the transfer `params` name (same transfer id and producer: a retry
 * under the same params). That one still loads it and releases it itself; a release by this one would
 * take its KV away (READ: the grant ends under its READ; WRITE: prefill drops its push).
 */
export function namesLiveTransfer(
  self: object,
  params: KVTransferParams | null,
  live: Iterable<{ kvTransferParams: KVTransferParams | null }>,
): boolean {
  if (params === null || typeof params.transfer_id !== 'string') return false;
  for (const other of live) {
    const q = other.kvTransferParams;
    if (other !== self && q?.transfer_id === params.transfer_id && q.remote_engine_id === params.remote_engine_id)
      return true;
  }
  return false;
}

export interface RequestInit {
  requestId: string;
  promptTokenIds: number[];
  sampling: SamplingParamsData;
  kvTransferParams?: KVTransferParams | null;
  arrivalMs: number;
}

export class Request {
  readonly requestId: string;
  readonly promptTokenIds: readonly number[];
  readonly sampling: SamplingParamsData;
  readonly arrivalMs: number;
  readonly outputTokenIds: number[] = [];
  status: RequestStatus = 'WAITING';
  numComputedTokens = 0;
  numOutputPlaceholders = 0;
  /** Unique among every request of the process (nextEpoch): see there. */
  epoch = nextEpoch();
  numPreemptions = 0;
  kvTransferParams: KVTransferParams | null;
  /** Params the connector returned at finish (prefill side), sent back to the client. */
  finishedKvTransferParams: Record<string, unknown> | null = null;
  error: HandoffError | null = null;
  /** Computed tokens that came from an external load (decode side), for metrics. */
  numExternalComputedTokens = 0;
  /** Tokens of the local prefix hit at its latest fresh admission (a failed load's recovery starts past them). */
  numLocalHitTokens = 0;
  /**
   * Tokens of the local prefix hit at its first admission (vLLM's num_cached_tokens; the prefix-cache
   * metrics): an admission after a preemption hits the request's own pages, which are no prompt hit.
   */
  numPromptHitTokens: number | null = null;
  firstTokenMs: number | null = null;

  constructor(init: RequestInit) {
    assert(init.promptTokenIds.length > 0, 'a request needs at least one prompt token');
    assert(init.sampling.maxTokens >= 1, 'maxTokens must be >= 1');
    this.requestId = init.requestId;
    this.promptTokenIds = [...init.promptTokenIds];
    this.sampling = init.sampling;
    this.kvTransferParams = init.kvTransferParams ?? null;
    this.arrivalMs = init.arrivalMs;
  }

  get numPromptTokens(): number {
    return this.promptTokenIds.length;
  }
  /** Tokens known on the host (prompt + processed outputs). */
  get numTokens(): number {
    return this.promptTokenIds.length + this.outputTokenIds.length;
  }
  /** Tokens including the ones still being sampled by in-flight steps. */
  get numTokensWithPlaceholders(): number {
    return this.numTokens + this.numOutputPlaceholders;
  }
  get allTokenIds(): number[] {
    return [...this.promptTokenIds, ...this.outputTokenIds];
  }
  get isFinished(): boolean {
    return isFinished(this.status);
  }
  /** May another sampling step be scheduled without exceeding maxTokens? */
  get canSampleMore(): boolean {
    return this.outputTokenIds.length + this.numOutputPlaceholders < this.sampling.maxTokens;
  }
  /** Admitted with no computed token: `n` tokens of its prefix were found in the prefix cache. */
  noteLocalHit(n: number): void {
    this.numLocalHitTokens = n;
    this.numPromptHitTokens ??= n;
  }

  /**
   * A request finishing before it loaded whose transfer another live request names (a retry under the
   * same params) gives the transfer up to that one (no release of it: namesLiveTransfer).
   */
  leaveSharedTransfer(live: Iterable<Request>): void {
    const p = this.kvTransferParams;
    if (p?.do_remote_prefill === true && namesLiveTransfer(this, p, live)) p.do_remote_prefill = false;
  }
}
