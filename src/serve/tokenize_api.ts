/**
 * vLLM's tokenizer endpoints, answered by an instance (the proxy passes them to a decode instance):
 *
 *   POST /tokenize    {model?, prompt: string} or {model?, messages, add_generation_prompt?}
 *                     [+ add_special_tokens?, return_token_strs?]
 *                     → {count, max_model_len, tokens, token_strs}
 *   POST /detokenize  {model?, tokens: number[]} → {prompt}
 *   GET  /version     {version}
 *
 * The prompt goes through the same checks and chat template as a completion's (so `count` is what a
 * completion of that prompt would count) and is tokenized off the event loop like one. The GPT-2
 * tokenizer adds no special tokens, so `add_special_tokens` changes nothing. `token_strs` holds each
 * token's vocabulary string, as vLLM's (convert_ids_to_tokens: " world" is "Ġworld", and a token holding
 * part of a character reads as its bytes, not U+FFFD). Unknown fields are ignored, as vLLM's request
 * models do.
 */
import { createRequire } from 'node:module';
import { z } from 'zod';
import { VOCAB_SIZE } from '../model/config.ts';
import { decode, tokenString } from '../model/tokenizer.ts';
import { HandoffError } from '../util/errors.ts';
import { describeZodError } from '../util/field_errors.ts';
import { ASSISTANT_TURN } from './chat_template.ts';
import { validateApiRequest, type RequestLimits } from './openai_request.ts';

export interface TokenizeDeps {
  modelName: string;
  limits: RequestLimits;
  /** Text to ids, off the event loop for long texts (TokenizerThreads.encode). */
  encode(text: string): Promise<number[]>;
}

export const HANDOFF_VERSION: string = (createRequire(import.meta.url)('../../package.json') as { version: string })
  .version;

const flag = z.boolean().nullish();
const tokenizeSchema = z.object({
  model: z.string().max(256).nullish(),
  add_special_tokens: flag,
  add_generation_prompt: flag,
  return_token_strs: flag,
});

function parsed<T extends z.ZodTypeAny>(schema: T, body: Record<string, unknown>): z.infer<T> {
  const r = schema.safeParse(body);
  if (r.success) return r.data;
  const p = describeZodError(r.error, body);
  throw new HandoffError('BAD_REQUEST', p.message, p.param === null ? undefined : { param: p.param });
}

/** An absent or empty model is the served one (vLLM's _is_model_supported); another is a 404. */
function checkModel(model: string | null | undefined, deps: TokenizeDeps): void {
  if (model === null || model === undefined || model === '' || model === deps.modelName) return;
  throw new HandoffError('NOT_FOUND', `the model '${model}' does not exist (this server serves '${deps.modelName}')`, {
    param: 'model',
  });
}

/** The text a /tokenize body names: a completion's prompt, or chat messages through the chat template. */
function textOf(body: Record<string, unknown>, addGenerationPrompt: boolean, limits: RequestLimits): string {
  const hasPrompt = body['prompt'] !== undefined;
  if (hasPrompt === (body['messages'] !== undefined))
    throw new HandoffError('BAD_REQUEST', 'exactly one of prompt (a string) and messages is required', {
      param: hasPrompt ? 'messages' : 'prompt',
    });
  if (hasPrompt && typeof body['prompt'] !== 'string')
    throw new HandoffError('BAD_REQUEST', 'prompt must be a string', { param: 'prompt' });
  const kind = hasPrompt ? 'completion' : 'chat';
  const fields = hasPrompt ? { prompt: body['prompt'] } : { messages: body['messages'] };
  const v = validateApiRequest(kind, fields, limits);
  if ('ids' in v.prompt) throw new HandoffError('BAD_REQUEST', 'prompt must be a string', { param: 'prompt' });
  const text = v.prompt.text;
  return hasPrompt || addGenerationPrompt ? text : text.slice(0, text.length - ASSISTANT_TURN.length);
}

export async function tokenizeAnswer(body: Record<string, unknown>, deps: TokenizeDeps): Promise<unknown> {
  const b = parsed(tokenizeSchema, body);
  checkModel(b.model, deps);
  const text = textOf(body, b.add_generation_prompt ?? true, deps.limits);
  const tokens = await deps.encode(text);
  return {
    count: tokens.length,
    max_model_len: deps.limits.maxModelLen,
    tokens,
    token_strs: b.return_token_strs === true ? tokens.map(tokenString) : null,
  };
}

export function detokenizeAnswer(body: Record<string, unknown>, deps: TokenizeDeps): unknown {
  const schema = z.object({
    model: z.string().max(256).nullish(),
    tokens: z
      .array(
        z
          .number()
          .int()
          .min(0)
          .max(VOCAB_SIZE - 1),
      )
      .max(deps.limits.maxModelLen, `at most ${deps.limits.maxModelLen} tokens (the model's maximum length)`),
  });
  // The length first: a 2,000,000-id body is "too many tokens", not 2,000,000 checks.
  const tokens = body['tokens'];
  if (Array.isArray(tokens) && tokens.length > deps.limits.maxModelLen)
    throw new HandoffError('BAD_REQUEST', `at most ${deps.limits.maxModelLen} tokens (the model's maximum length)`, {
      param: 'tokens',
    });
  const b = parsed(schema, body);
  checkModel(b.model, deps);
  return { prompt: decode(b.tokens) };
}
