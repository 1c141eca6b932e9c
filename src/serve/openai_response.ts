/**
 * OpenAI response bodies and stream chunks for one request (plain objects). Completions:
 * `text_completion`; chat: `chat.completion` / `chat.completion.chunk`. vLLM's extras ride along:
 * `kv_transfer_params` top level, `token_ids` / `prompt_token_ids` on the choice when asked for.
 */
import { tokenBytes } from '../model/tokenizer.ts';
import type { ApiKind } from './openai_request.ts';

/** Tokens and the text they released, with per-token logprobs (token text and offset per token). */
export interface Piece {
  text: string;
  tokenIds: number[];
  tokenTexts: string[];
  logprobs: Array<number | null>;
  textOffsets: number[];
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export type ApiFinishReason = 'stop' | 'length';

export interface ResponseContext {
  kind: ApiKind;
  /** Request id as the client knows it (X-Request-Id). */
  requestId: string;
  createdSec: number;
  model: string;
  logprobs: boolean;
  returnTokenIds: boolean;
  promptTokenIds: readonly number[];
}

export function emptyPiece(): Piece {
  return { text: '', tokenIds: [], tokenTexts: [], logprobs: [], textOffsets: [] };
}

export function appendPiece(into: Piece, p: Piece): void {
  into.text += p.text;
  into.tokenIds.push(...p.tokenIds);
  into.tokenTexts.push(...p.tokenTexts);
  into.logprobs.push(...p.logprobs);
  into.textOffsets.push(...p.textOffsets);
}

export function usageOf(promptTokens: number, completionTokens: number): Usage {
  return {
    prompt_tokens: promptTokens,
    completion_tokens: completionTokens,
    total_tokens: promptTokens + completionTokens,
  };
}

function responseId(ctx: ResponseContext): string {
  return `${ctx.kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${ctx.requestId}`;
}

function logprobsOf(ctx: ResponseContext, p: Piece): unknown {
  if (!ctx.logprobs) return null;
  if (ctx.kind === 'completion') {
    // vLLM lists the top `logprobs + 1` per token: with logprobs 0, the sampled token alone.
    const top = p.tokenTexts.map((t, i) => {
      const lp = p.logprobs[i] ?? null;
      return lp === null ? null : { [t]: lp };
    });
    return { tokens: p.tokenTexts, token_logprobs: p.logprobs, top_logprobs: top, text_offset: p.textOffsets };
  }
  return {
    content: p.tokenTexts.map((token, i) => ({
      token,
      logprob: p.logprobs[i] ?? null,
      // The token's own bytes: part of a character is not U+FFFD's bytes (OpenAI: combined, they give the text).
      bytes: [...tokenBytes(p.tokenIds[i] as number)],
      top_logprobs: [],
    })),
  };
}

function head(ctx: ResponseContext, stream: boolean): Record<string, unknown> {
  const object = ctx.kind === 'chat' ? (stream ? 'chat.completion.chunk' : 'chat.completion') : 'text_completion';
  return { id: responseId(ctx), object, created: ctx.createdSec, model: ctx.model };
}

/** The whole (non-streaming) response. */
export function fullResponse(
  ctx: ResponseContext,
  all: Piece,
  finishReason: ApiFinishReason,
  usage: Usage,
  kvTransferParams: Record<string, unknown> | null,
  stopReason: string | number | null = null,
): unknown {
  const choice: Record<string, unknown> =
    ctx.kind === 'chat'
      ? {
          index: 0,
          message: { role: 'assistant', content: all.text },
          logprobs: logprobsOf(ctx, all),
          finish_reason: finishReason,
          stop_reason: stopReason,
        }
      : {
          index: 0,
          text: all.text,
          logprobs: logprobsOf(ctx, all),
          finish_reason: finishReason,
          stop_reason: stopReason,
        };
  if (ctx.returnTokenIds) {
    choice['token_ids'] = all.tokenIds;
    choice['prompt_token_ids'] = [...ctx.promptTokenIds];
  }
  return { ...head(ctx, false), choices: [choice], usage, kv_transfer_params: kvTransferParams };
}

/**
 * A chat stream's first chunk: the role alone, before any token (vLLM's first iteration, and OpenAI's).
 * The `openai` client's stream helper keeps the first chunk's logprobs and then appends them again, so a
 * first chunk that carried a token doubled that token's logprob.
 */
export function roleChunk(ctx: ResponseContext): unknown {
  const choice: Record<string, unknown> = {
    index: 0,
    delta: { role: 'assistant', content: '' },
    logprobs: null,
    finish_reason: null,
  };
  if (ctx.returnTokenIds) {
    choice['token_ids'] = [];
    choice['prompt_token_ids'] = [...ctx.promptTokenIds];
  }
  return { ...head(ctx, true), choices: [choice] };
}

/** One stream chunk; `first` adds the assistant role to a chat delta (and the prompt's ids when asked for). */
export function streamChunk(
  ctx: ResponseContext,
  p: Piece,
  finishReason: ApiFinishReason | null,
  first: boolean,
  kvTransferParams: Record<string, unknown> | null = null,
  stopReason: string | number | null = null,
): unknown {
  const choice: Record<string, unknown> =
    ctx.kind === 'chat'
      ? {
          index: 0,
          delta: first ? { role: 'assistant', content: p.text } : { content: p.text },
          logprobs: logprobsOf(ctx, p),
          finish_reason: finishReason,
          stop_reason: stopReason,
        }
      : { index: 0, text: p.text, logprobs: logprobsOf(ctx, p), finish_reason: finishReason, stop_reason: stopReason };
  if (ctx.returnTokenIds) {
    choice['token_ids'] = p.tokenIds;
    if (first) choice['prompt_token_ids'] = [...ctx.promptTokenIds];
  }
  const chunk: Record<string, unknown> = { ...head(ctx, true), choices: [choice] };
  if (kvTransferParams !== null) chunk['kv_transfer_params'] = kvTransferParams;
  return chunk;
}

/** The final usage chunk of `stream_options.include_usage` (no choices). */
export function usageChunk(ctx: ResponseContext, usage: Usage): unknown {
  return { ...head(ctx, true), choices: [], usage };
}
