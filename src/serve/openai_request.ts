/**
 * OpenAI request bodies (/v1/completions, /v1/chat/completions) validated with zod and turned into one
 * plain `ApiRequest`. Unknown fields are ignored like OpenAI's API does; known fields with a wrong type
 * or out of range, and features we do not implement (n > 1, echo, penalties, top alternatives), are a
 * BAD_REQUEST; a prompt that cannot fit the model is PROMPT_TOO_LONG. Nothing reaches the engine
 * before this passes. vLLM extensions: ignore_eos, top_k, stop_token_ids, return_token_ids,
 * kv_transfer_params.
 */
import { z } from 'zod';
import { HandoffError } from '../util/errors.ts';
import { VOCAB_SIZE } from '../model/config.ts';
import { encode } from '../model/tokenizer.ts';
import { parseKvTransferParams, type KVTransferParams } from '../connector/params.ts';
import { applyChatTemplate } from './chat_template.ts';

export type ApiKind = 'completion' | 'chat';

export interface ApiRequest {
  kind: ApiKind;
  model: string | null;
  promptTokenIds: number[];
  maxTokens: number;
  temperature: number;
  topP: number | undefined;
  topK: number | undefined;
  /** null: the server draws one (sampling is always seeded). */
  seed: number | null;
  stop: string[];
  stopTokenIds: number[];
  ignoreEos: boolean;
  stream: boolean;
  includeUsage: boolean;
  logprobs: boolean;
  returnTokenIds: boolean;
  kvTransferParams: KVTransferParams | null;
}

export interface RequestLimits {
  maxModelLen: number;
}

/** OpenAI's legacy default for /v1/completions. */
export const DEFAULT_COMPLETION_MAX_TOKENS = 16;

const tokenId = z.number().int().min(0).max(VOCAB_SIZE - 1);
const zeroOnly = (what: string) => z.number().refine((v) => v === 0, `${what} is not supported (only 0)`);

const common = {
  model: z.string().max(256).nullish(),
  max_tokens: z.number().int().min(1).nullish(),
  max_completion_tokens: z.number().int().min(1).nullish(),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().gt(0).max(1).nullish(),
  top_k: z.number().int().min(-1).max(VOCAB_SIZE).nullish(),
  seed: z.number().int().min(Number.MIN_SAFE_INTEGER).max(Number.MAX_SAFE_INTEGER).nullish(),
  stop: z.union([z.string().min(1).max(256), z.array(z.string().min(1).max(256)).max(16)]).nullish(),
  stop_token_ids: z.array(tokenId).max(64).nullish(),
  n: z.number().refine((v) => v === 1, 'only n=1 is supported').nullish(),
  best_of: z.number().refine((v) => v === 1, 'only best_of=1 is supported').nullish(),
  presence_penalty: zeroOnly('presence_penalty').nullish(),
  frequency_penalty: zeroOnly('frequency_penalty').nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.object({ include_usage: z.boolean().nullish() }).nullish(),
  ignore_eos: z.boolean().nullish(),
  return_token_ids: z.boolean().nullish(),
  kv_transfer_params: z.unknown().optional(),
};

const completionSchema = z.object({
  ...common,
  prompt: z.union([
    z.string().min(1),
    z.array(tokenId).min(1),
    z.tuple([z.string().min(1)]),
    z.tuple([z.array(tokenId).min(1)]),
  ]),
  echo: z.literal(false).nullish(),
  suffix: z.null().optional(),
  logprobs: z.number().int().refine((v) => v === 0, 'top alternatives are not computed: use logprobs: 0 for the sampled tokens').nullish(),
});

const textPart = z.object({ type: z.literal('text'), text: z.string() });
const chatSchema = z.object({
  ...common,
  messages: z
    .array(
      z.object({
        role: z.enum(['system', 'developer', 'user', 'assistant', 'tool']),
        content: z.union([z.string(), z.array(textPart).max(64)]),
      }),
    )
    .min(1)
    .max(256),
  logprobs: z.boolean().nullish(),
  top_logprobs: z.number().int().refine((v) => v === 0, 'top alternatives are not computed (top_logprobs must be 0)').nullish(),
});

function firstIssue(error: z.ZodError): string {
  const issue = error.issues[0];
  const where = issue && issue.path.length > 0 ? issue.path.join('.') : '(body)';
  return `${where}: ${issue?.message ?? 'invalid value'}`;
}

export function parseApiRequest(kind: ApiKind, body: unknown, limits: RequestLimits): ApiRequest {
  const r = kind === 'completion' ? completionSchema.safeParse(body) : chatSchema.safeParse(body);
  if (!r.success) throw new HandoffError('BAD_REQUEST', `invalid request: ${firstIssue(r.error)}`);
  const b = r.data;
  let promptTokenIds: number[];
  if ('prompt' in b) {
    const p = Array.isArray(b.prompt) && b.prompt.length === 1 && typeof b.prompt[0] !== 'number' ? b.prompt[0] : b.prompt;
    promptTokenIds = typeof p === 'string' ? encode(p) : [...(p as number[])];
  } else {
    const messages = b.messages.map((m) => ({ role: m.role, content: typeof m.content === 'string' ? m.content : m.content.map((t) => t.text).join('') }));
    promptTokenIds = encode(applyChatTemplate(messages));
  }
  if (promptTokenIds.length === 0) throw new HandoffError('BAD_REQUEST', 'the prompt is empty after tokenization');
  if (promptTokenIds.length >= limits.maxModelLen) {
    throw new HandoffError('PROMPT_TOO_LONG', `the prompt has ${promptTokenIds.length} tokens; this model takes at most ${limits.maxModelLen - 1} prompt tokens`);
  }
  const room = limits.maxModelLen - promptTokenIds.length;
  const asked = b.max_completion_tokens ?? b.max_tokens ?? null;
  if (asked !== null && asked > limits.maxModelLen) {
    throw new HandoffError('BAD_REQUEST', `max_tokens must be in [1, ${limits.maxModelLen}], got ${asked}`);
  }
  // Chat defaults to the rest of the context like vLLM; completions to OpenAI's 16.
  const maxTokens = asked ?? (kind === 'chat' ? room : Math.min(DEFAULT_COMPLETION_MAX_TOKENS, room));
  if (promptTokenIds.length + maxTokens > limits.maxModelLen) {
    throw new HandoffError(
      'PROMPT_TOO_LONG',
      `prompt (${promptTokenIds.length} tokens) + max_tokens (${maxTokens}) exceeds the model's maximum length ${limits.maxModelLen}`,
    );
  }
  const logprobs = kind === 'chat' ? b.logprobs === true : 'logprobs' in b && b.logprobs !== null && b.logprobs !== undefined;
  const topK = b.top_k === null || b.top_k === undefined || b.top_k <= 0 ? undefined : b.top_k;
  return {
    kind,
    model: b.model ?? null,
    promptTokenIds,
    maxTokens,
    temperature: b.temperature ?? 1,
    topP: b.top_p ?? undefined,
    topK,
    seed: b.seed ?? null,
    stop: b.stop === null || b.stop === undefined ? [] : typeof b.stop === 'string' ? [b.stop] : [...b.stop],
    stopTokenIds: [...(b.stop_token_ids ?? [])],
    ignoreEos: b.ignore_eos ?? false,
    stream: b.stream ?? false,
    includeUsage: (b.stream ?? false) && (b.stream_options?.include_usage ?? false),
    logprobs,
    returnTokenIds: b.return_token_ids ?? false,
    kvTransferParams: parseKvTransferParams(b.kv_transfer_params),
  };
}
