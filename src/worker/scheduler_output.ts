/**
 * SchedulerOutput: the plain data one scheduling step hands to the worker (vLLM's SchedulerOutput in
 * camelCase). Defined in the worker layer because the worker is the lowest layer that consumes it; the
 * engine's scheduler builds it and the connector's scheduler side may filter `newBlockIdsToZero`
 * (synchronous READ destinations, DESIGN.md §6), nothing else.
 */

import type { KVConnectorMetadata } from './connector_metadata.ts';

export interface SamplingParamsData {
  maxTokens: number;
  temperature: number;
  topP?: number;
  topK?: number;
  seed: number;
  stopTokenIds: number[];
  ignoreEos: boolean;
}

/** A request the worker has not seen, or one it must rebuild (resumed after preemption or rollback). */
export interface NewRequestData {
  requestId: string;
  /** Every token known so far (prompt, then outputs already processed). */
  tokenIds: number[];
  numPromptTokens: number;
  /** Pages per KV cache group, complete. */
  blockIds: number[][];
  /** Tokens already in the cache (local prefix hit + external load). */
  numComputedTokens: number;
  sampling: SamplingParamsData;
  /** Output index of the next sampled token (seeded sampling is keyed by it). */
  numOutputTokens: number;
}

export interface CachedRequestData {
  requestId: string;
  /** Pages added this step, per group (may be empty lists). */
  newBlockIds: number[][];
  numComputedTokens: number;
  /**
   * Known new tokens to feed (a prefill chunk); empty for a decode step, whose input is the token sampled last step.
   */
  newTokenIds: number[];
  numOutputTokens: number;
}

export interface SchedulerOutput {
  step: number;
  scheduledNewReqs: NewRequestData[];
  scheduledCachedReqs: CachedRequestData[];
  /** requestId -> tokens computed this step. */
  numScheduledTokens: Record<string, number>;
  totalNumScheduledTokens: number;
  /** requestId -> whether a token is sampled after this step's tokens. */
  sampleAfter: Record<string, boolean>;
  finishedReqIds: string[];
  preemptedReqIds: string[];
  /** Pages freshly allocated this step that the worker zeroes before use; null when zeroing is not needed. */
  newBlockIdsToZero: number[] | null;
  /** Copy-on-write copies (src, dst), applied after zeroing and before the forward. */
  kvCacheBlockCopies: Array<[number, number]>;
  /** Whether any scheduled request consumes KV loaded synchronously this step (a READ). */
  hasSyncKvLoads: boolean;
  /** The connector's per-step metadata (plain data), null without a connector. */
  kvConnectorMetadata: KVConnectorMetadata | null;
}

export function makeEmptySchedulerOutput(step = 0): SchedulerOutput {
  return {
    step,
    scheduledNewReqs: [],
    scheduledCachedReqs: [],
    numScheduledTokens: {},
    totalNumScheduledTokens: 0,
    sampleAfter: {},
    finishedReqIds: [],
    preemptedReqIds: [],
    newBlockIdsToZero: null,
    kvCacheBlockCopies: [],
    hasSyncKvLoads: false,
    kvConnectorMetadata: null,
  };
}

/** What the worker reports for one step (vLLM's ModelRunnerOutput + KVConnectorOutput). */
export interface ModelRunnerOutput {
  step: number;
  /** Sampled tokens of requests that sampled this step. */
  sampled: Array<{
    requestId: string;
    tokenId: number;
    logprob: number | null;
    logitsHash: string | null;
    nanLogits: boolean;
  }>;
  /** Requests whose forward or sampling failed on the device this step → why (they fail alone, with a 500). */
  forwardErrors?: Record<string, string>;
  kvConnectorOutput: KVConnectorOutput;
}

export interface KVConnectorOutput {
  finishedSending: string[];
  finishedRecving: string[];
  /** Pages whose load failed (READ failed or timed out); the scheduler applies kvLoadFailurePolicy. */
  invalidBlockIds: number[];
  /** Requests whose load failed this step (their sampled output, if any, is discarded). */
  failedLoadReqIds: string[];
  /** Per failed request: the error code and message (plain data). */
  loadErrors: Record<string, { code: string; message: string }>;
}

export function emptyConnectorOutput(): KVConnectorOutput {
  return { finishedSending: [], finishedRecving: [], invalidBlockIds: [], failedLoadReqIds: [], loadErrors: {} };
}
