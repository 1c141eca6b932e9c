/**
 * The model's boundary types: plain, serialisable data, because a forward crosses into the device's
 * compute-stream thread as a kernel op (`{ kind: 'kernel', name: 'forward', args: ForwardArgs }`).
 */
import type { KVCacheConfig } from '../kv/spec.ts';
import type { ModelPreset } from '../kv/presets.ts';

/** What `createKernels` receives (DeviceOptions.kernelInit): plain data only. */
export interface ModelKernelInit {
  preset: ModelPreset;
  seed: number;
  kvConfig: KVCacheConfig;
}

export interface SamplingParams {
  /** 0 means greedy argmax (lowest index on ties). */
  temperature: number;
  topP?: number;
  topK?: number;
  /** The request's sampling seed; with outputIndex it alone decides the random draw. */
  seed: number;
  /** Index of the output token being sampled (0 for the first generated token). */
  outputIndex: number;
}

export interface ForwardRequest {
  requestId: string;
  /** The tokens computed this step (a chunk): positions startPos .. startPos + tokenIds.length - 1. */
  tokenIds: number[];
  /** Tokens already in the cache. */
  startPos: number;
  /** Per KV group (kvConfig.groups order), the request's pages in order. */
  blockTables: number[][];
  /** Sample a token after the last one (false for a partial prefill chunk). */
  sample: boolean;
  sampling: SamplingParams;
}

export interface ForwardArgs {
  step: number;
  requests: ForwardRequest[];
}

export interface ForwardOutput {
  requestId: string;
  tokenId: number | null;
  /** Log-probability of tokenId under the raw logits (temperature 1), or null (no sample, or NaN logits). */
  logprob: number | null;
  /** Hex hash of the logits' Float32Array bytes, so "logit for logit" equality can be checked. */
  logitsHash: string | null;
  nanLogits: boolean;
  /** Set when this request's forward or sampling failed on the device (the step's other requests ran). */
  error?: string;
}

export interface ForwardResult {
  outputs: ForwardOutput[];
}
