/**
 * The engine's own check of a request, when it is made (`LLMEngine.makeRequest`, before `addRequest`):
 * the HTTP edge validates first, but the engine does not trust it (a bound dropped at the edge once let
 * `top_p: 1.5` crash the engine loop). Every value the sampler and the model assert on is checked here
 * and refused as a BAD_REQUEST naming the field, so nothing a client sends can reach those assertions.
 */
import { HandoffError } from '../util/errors.ts';
import type { KVCacheConfig } from '../kv/spec.ts';
import type { SamplingParamsData } from '../worker/scheduler_output.ts';
import type { Request } from './request.ts';
import type { SchedulerConfig } from './scheduler_config.ts';

/** The sampler's temperature range (OpenAI's API bound). */
export const TEMPERATURE_MAX = 2;

function refuse(param: string, message: string): never {
  throw new HandoffError('BAD_REQUEST', `${param} ${message}`, { param });
}

function isTokenId(t: unknown, vocabSize: number): boolean {
  return Number.isInteger(t) && (t as number) >= 0 && (t as number) < vocabSize;
}

/** `vocabSize`: the model's (model/config.ts vocabSizeOf). */
export function validateSampling(s: SamplingParamsData, vocabSize: number): void {
  if (!Number.isInteger(s.maxTokens) || s.maxTokens < 1)
    refuse('max_tokens', `must be an integer >= 1, got ${String(s.maxTokens)}`);
  const t = s.temperature;
  if (typeof t !== 'number' || !Number.isFinite(t) || t < 0 || t > TEMPERATURE_MAX)
    refuse('temperature', `must be in [0, ${TEMPERATURE_MAX}], got ${String(t)}`);
  const p = s.topP;
  if (p !== undefined && (typeof p !== 'number' || !(p > 0 && p <= 1)))
    refuse('top_p', `must be in (0, 1], got ${String(p)}`);
  const k = s.topK;
  if (k !== undefined && (!Number.isInteger(k) || k < 0 || k > vocabSize))
    refuse('top_k', `must be an integer in [0, ${vocabSize}], got ${String(k)}`);
  if (!Number.isSafeInteger(s.seed)) refuse('seed', `must be a safe integer, got ${String(s.seed)}`);
  if (!Array.isArray(s.stopTokenIds) || !s.stopTokenIds.every((t) => isTokenId(t, vocabSize)))
    refuse('stop_token_ids', `must be token ids in [0, ${vocabSize})`);
  if (typeof s.ignoreEos !== 'boolean') refuse('ignore_eos', 'must be a boolean');
}

export function validatePromptTokenIds(ids: readonly number[], vocabSize: number): void {
  if (ids.length === 0) refuse('prompt', 'is empty');
  const bad = ids.findIndex((t) => !isTokenId(t, vocabSize));
  if (bad >= 0) refuse('prompt', `token ${bad} is ${String(ids[bad])}, not a token id in [0, ${vocabSize})`);
}

/** Pages a request of `numTokens` tokens holds at most across all groups (a Mamba group holds one). */
export function pagesNeeded(kvConfig: KVCacheConfig, numTokens: number, numLookaheadTokens: number): number {
  return kvConfig.groups.reduce(
    (n, g) => n + (g.spec.type === 'mamba' ? 1 : Math.ceil((numTokens + numLookaheadTokens) / g.spec.blockSize)),
    0,
  );
}

/** A request that could never run here: too long for the model, or more pages than the pool has. */
export function checkRequestFits(req: Request, config: SchedulerConfig, kvConfig: KVCacheConfig): void {
  const longest = req.numPromptTokens + req.sampling.maxTokens;
  if (longest > config.maxModelLen) {
    const what = `prompt (${req.numPromptTokens} tokens) + max_tokens (${req.sampling.maxTokens})`;
    throw new HandoffError('PROMPT_TOO_LONG', `${what} exceeds the model's maximum length ${config.maxModelLen}`, {
      param: 'max_tokens',
    });
  }
  // Without chunked prefill a prompt is computed in one step: one longer than a step's budget never runs
  // (and, at the head of the queue, held up every request behind it).
  if (!config.enableChunkedPrefill && req.numPromptTokens > config.maxNumBatchedTokens) {
    throw new HandoffError(
      'PROMPT_TOO_LONG',
      `the prompt has ${req.numPromptTokens} tokens; without chunked prefill a step computes at most ${config.maxNumBatchedTokens}`,
      { param: 'prompt' },
    );
  }
  const need = pagesNeeded(kvConfig, longest, config.numLookaheadTokens);
  if (need > kvConfig.numBlocks - 1) {
    throw new HandoffError(
      'OUT_OF_PAGES',
      `the request needs ${need} KV pages at its longest; this instance has ${kvConfig.numBlocks - 1}`,
    );
  }
}
