/** What the engine reports per request per processed step (plain data, to the API layer). */
import type { HandoffError } from '../util/errors.ts';
import type { FinishReason, Request } from './request.ts';

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

export function makeOutput(
  req: Request,
  finishReason: FinishReason | null,
  extra: {
    token?: { tokenId: number; logprob: number | null; logitsHash: string | null; nanLogits: boolean };
    kvTransferParams?: Record<string, unknown> | null;
    error?: HandoffError | null;
  } = {},
): EngineOutput {
  const t = extra.token;
  return {
    requestId: req.requestId,
    newTokenIds: t ? [t.tokenId] : [],
    newLogprobs: t ? [t.logprob] : [],
    logitsHashes: t ? [t.logitsHash] : [],
    nanLogits: t?.nanLogits ?? false,
    finishReason,
    kvTransferParams: extra.kvTransferParams ?? null,
    error: extra.error ?? null,
    numPromptTokens: req.numPromptTokens,
    numCachedTokens: req.numPromptHitTokens ?? 0,
    numExternalTokens: req.numExternalComputedTokens,
  };
}
