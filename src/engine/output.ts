/** What the engine reports per request per processed step (plain data, to the API layer). */
import type { HandoffError } from '../util/errors.ts';
import type { FinishReason } from './request.ts';

export interface EngineOutput {
  requestId: string;
  newTokenIds: number[];
  newLogprobs: Array<number | null>;
  logitsHashes: Array<string | null>;
  nanLogits: boolean;
  finishReason: FinishReason | null;
  /** Prefill side: params for the decode side (remote_block_ids, grant, ...). */
  kvTransferParams: Record<string, unknown> | null;
  error: HandoffError | null;
  numPromptTokens: number;
  numCachedTokens: number;
  numExternalTokens: number;
}
