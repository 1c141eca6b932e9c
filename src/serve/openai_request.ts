/**
 * OpenAI request bodies (/v1/completions, /v1/chat/completions) validated and turned into one plain
 * `ApiRequest`, in two steps so that tokenizing can leave the event loop:
 *
 *   validateApiRequest (sync: types, ranges, refused fields, the prompt's length in characters)
 *     → ValidatedRequest { prompt: text or token ids }
 *     → tokenize the text (inline or on a tokenizer thread: the caller decides)
 *   tokenizedApiRequest (sync: the prompt's length in tokens, max_tokens defaults) → ApiRequest
 *
 * Every refusal is a HandoffError whose `param` names the field (`max_tokens`, `messages[0].content`,
 * `kv_transfer_params.remote_port`) and whose message says what is wrong in the client's terms:
 * BAD_REQUEST for types, ranges and features we do not implement (request_fields.ts), PROMPT_TOO_LONG
 * for a prompt that cannot fit the model. Unknown fields are ignored like vLLM does. Nothing reaches
 * the engine before this passes. vLLM extensions: ignore_eos, top_k, stop_token_ids,
 * include_stop_str_in_output, return_token_ids, kv_transfer_params.
 */
import { z } from 'zod';
import { HandoffError } from '../util/errors.ts';
import { describeZodError, preview } from '../util/field_errors.ts';
import { VOCAB_SIZE } from '../model/config.ts';
import { encode, MAX_TOKEN_BYTES } from '../model/tokenizer.ts';
import { kvTransferParamsSchema, parseKvTransferParams, type KVTransferParams } from '../connector/params.ts';
import { applyChatTemplate } from './chat_template.ts';
import { refuseUnsupportedFields } from './request_fields.ts';

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
  /** vLLM's include_stop_str_in_output: the stop string (or stop token's text) ends the text. */
  includeStopStr: boolean;
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

/** The prompt before tokenizing: text (and the field it came from) or token ids as given. */
export type PromptInput = { text: string; param: string } | { ids: number[]; param: string };

/**
 * Everything but the prompt's tokens; `askedMaxTokens` null = the endpoint's default: at most
 * `defaultMaxTokens` (null: the rest of the context).
 */
export interface ValidatedRequest extends Omit<ApiRequest, 'promptTokenIds' | 'maxTokens'> {
  prompt: PromptInput;
  askedMaxTokens: number | null;
  defaultMaxTokens: number | null;
}

/** OpenAI's legacy default for /v1/completions. */
export const DEFAULT_COMPLETION_MAX_TOKENS = 16;

/**
 * The longest prompt text that can still fit, in UTF-16 code units: every code unit is at least one
 * UTF-8 byte and no GPT-2 token is longer than MAX_TOKEN_BYTES bytes, so a longer text has at least
 * maxModelLen tokens and would be refused after tokenizing anyway. Refusing it before tokenizing
 * costs nothing and never refuses a prompt that fits. (A per-token average would be tighter but
 * wrong: one token can be 128 characters of a repeated symbol.)
 */
export function promptCharsMax(limits: RequestLimits): number {
  return (limits.maxModelLen - 1) * MAX_TOKEN_BYTES;
}

const textMax = 256;
const common = {
  model: z.string().max(textMax).nullish(),
  max_tokens: z.number().int().min(1).nullish(),
  max_completion_tokens: z.number().int().min(1).nullish(),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().gt(0).max(1).nullish(),
  // vLLM refuses only top_k < -1; any top_k outside (0, vocab size) means no top-k.
  top_k: z.number().int().min(-1).nullish(),
  seed: z.number().int().min(Number.MIN_SAFE_INTEGER).max(Number.MAX_SAFE_INTEGER).nullish(),
  stop: z
    .union([z.string().min(1).max(textMax), z.array(z.string().min(1).max(textMax)).max(16)], {
      error: 'must be a string or a list of strings',
    })
    .nullish(),
  stop_token_ids: z
    .array(
      z
        .number()
        .int()
        .min(0)
        .max(VOCAB_SIZE - 1),
    )
    .max(64)
    .nullish(),
  include_stop_str_in_output: z.boolean().nullish(),
  stream: z.boolean().nullish(),
  stream_options: z
    .object({
      include_usage: z.boolean().nullish(),
      continuous_usage_stats: z
        .literal(false, { error: 'is not supported by this server (only false is accepted)' })
        .nullish(),
    })
    .nullish(),
  ignore_eos: z.boolean().nullish(),
  return_token_ids: z.boolean().nullish(),
  // OpenAI's bookkeeping fields: accepted, checked, ignored.
  user: z.string().max(textMax).nullish(),
  metadata: z.record(z.string(), z.unknown()).nullish(),
  store: z.boolean().nullish(),
};

const completionSchema = z.object({
  ...common,
  logprobs: z
    .number()
    .int()
    .refine((v) => v === 0, 'top alternatives are not computed: use logprobs: 0 for the sampled tokens')
    .nullish(),
});

const NO_CALLS = 'is not supported by this server (tool calls are not rendered into the prompt; only [] or null)';
const textPart = z.object({ type: z.literal('text'), text: z.string() });
const chatSchema = z.object({
  ...common,
  messages: z
    .array(
      z.object({
        role: z.enum(['system', 'developer', 'user', 'assistant', 'tool']),
        content: z.union([z.string(), z.array(textPart).max(64)], {
          error: 'must be a string or a list of {"type": "text", "text": ...} parts',
        }),
        // The template renders content only: calls it would drop silently changed the conversation.
        tool_calls: z.array(z.unknown()).max(0, { error: NO_CALLS }).nullish(),
        function_call: z.null({ error: NO_CALLS }).nullish(),
      }),
    )
    .min(1)
    .max(256),
  logprobs: z.boolean().nullish(),
  top_logprobs: z
    .number()
    .int()
    .refine((v) => v === 0, 'top alternatives are not computed (top_logprobs must be 0)')
    .nullish(),
});

const bad = (param: string | null, message: string): HandoffError =>
  new HandoffError('BAD_REQUEST', message, param === null ? undefined : { param });

/** Step 1 (sync, no tokenizing): the body's fields, and the prompt as text or token ids. */
export function validateApiRequest(kind: ApiKind, body: unknown, limits: RequestLimits): ValidatedRequest {
  if (body === null || typeof body !== 'object' || Array.isArray(body))
    throw bad(null, 'the request body must be a JSON object');
  const raw = body as Record<string, unknown>;
  refuseUnsupportedFields(kind, raw);
  // The completion prompt first: a 100,000-id prompt is "too long", not 100,000 zod issues.
  const completionPrompt = kind === 'completion' ? promptOf(raw['prompt'], limits) : null;
  const r = kind === 'completion' ? completionSchema.safeParse(raw) : chatSchema.safeParse(raw);
  if (!r.success) {
    const p = describeZodError(r.error, raw);
    throw bad(p.param, p.message);
  }
  const b = r.data;
  // vLLM's validate_stream_options: a non-empty stream_options without stream is refused.
  const so = raw['stream_options'];
  if (b.stream !== true && so !== null && typeof so === 'object' && Object.keys(so).length > 0)
    throw bad('stream_options', 'stream_options can only be set when stream is true');
  let prompt: PromptInput;
  if (completionPrompt !== null) prompt = completionPrompt;
  else {
    const messages = (b as z.infer<typeof chatSchema>).messages.map((m, i) => ({
      role: m.role,
      // Text parts joined by a newline, as vLLM does for a string chat template (chat_utils.py).
      content: wholeText(
        typeof m.content === 'string' ? m.content : m.content.map((t) => t.text).join('\n'),
        `messages[${i}].content`,
      ),
    }));
    prompt = checkedText(applyChatTemplate(messages), 'messages', limits);
  }
  const askedParam =
    b.max_completion_tokens !== null && b.max_completion_tokens !== undefined ? 'max_completion_tokens' : 'max_tokens';
  const asked = b.max_completion_tokens ?? b.max_tokens ?? null;
  if (asked !== null && asked > limits.maxModelLen)
    throw bad(
      askedParam,
      `${askedParam} must be in [1, ${limits.maxModelLen}] (the model's maximum length), got ${asked}`,
    );
  // vLLM: a completion's max_tokens defaults to 16 when absent; null (either endpoint) is the rest of the
  // context (get_max_tokens), so only an absent max_tokens caps a completion at 16.
  const defaultMaxTokens =
    kind === 'completion' && raw['max_tokens'] === undefined ? DEFAULT_COMPLETION_MAX_TOKENS : null;
  const logprobs = kind === 'chat' ? b.logprobs === true : b.logprobs !== null && b.logprobs !== undefined;
  const topK = b.top_k === null || b.top_k === undefined || b.top_k <= 0 || b.top_k >= VOCAB_SIZE ? undefined : b.top_k;
  return {
    kind,
    model: b.model ?? null,
    prompt,
    askedMaxTokens: asked,
    defaultMaxTokens,
    temperature: b.temperature ?? 1,
    topP: b.top_p ?? undefined,
    topK,
    seed: b.seed ?? null,
    stop: b.stop === null || b.stop === undefined ? [] : typeof b.stop === 'string' ? [b.stop] : [...b.stop],
    stopTokenIds: [...(b.stop_token_ids ?? [])],
    includeStopStr: b.include_stop_str_in_output ?? false,
    ignoreEos: b.ignore_eos ?? false,
    stream: b.stream ?? false,
    includeUsage: (b.stream ?? false) && (b.stream_options?.include_usage ?? false),
    logprobs,
    returnTokenIds: b.return_token_ids ?? false,
    kvTransferParams: parseKvTransferParams(raw['kv_transfer_params']),
  };
}

/** Step 2 (sync): the request with its prompt's token ids; checks they fit the model with max_tokens. */
export function tokenizedApiRequest(v: ValidatedRequest, promptTokenIds: number[], limits: RequestLimits): ApiRequest {
  const { prompt, askedMaxTokens, defaultMaxTokens, ...rest } = v;
  if (promptTokenIds.length === 0) throw bad(prompt.param, 'the prompt is empty after tokenization');
  checkPromptTokens(promptTokenIds.length, prompt.param, limits);
  const room = limits.maxModelLen - promptTokenIds.length;
  // Chat defaults to the rest of the context like vLLM; completions to OpenAI's 16 (when max_tokens is absent).
  const maxTokens = askedMaxTokens ?? Math.min(defaultMaxTokens ?? room, room);
  if (promptTokenIds.length + maxTokens > limits.maxModelLen) {
    throw new HandoffError(
      'PROMPT_TOO_LONG',
      `prompt (${promptTokenIds.length} tokens) + max_tokens (${maxTokens}) exceeds the model's maximum length ${limits.maxModelLen}`,
      { param: prompt.param },
    );
  }
  return { ...rest, promptTokenIds, maxTokens };
}

/** Both steps with the tokenizer inline (tests, and callers whose prompts are small). */
export function parseApiRequest(kind: ApiKind, body: unknown, limits: RequestLimits): ApiRequest {
  const v = validateApiRequest(kind, body, limits);
  return tokenizedApiRequest(v, 'ids' in v.prompt ? v.prompt.ids : encode(v.prompt.text), limits);
}

/** Both steps, tokenizing with `encodeText` (e.g. a TokenizerThreads, off the event loop). */
export async function parseApiRequestAsync(
  kind: ApiKind,
  body: unknown,
  limits: RequestLimits,
  encodeText: (text: string) => Promise<number[]>,
): Promise<ApiRequest> {
  const v = validateApiRequest(kind, body, limits);
  return tokenizedApiRequest(v, 'ids' in v.prompt ? v.prompt.ids : await encodeText(v.prompt.text), limits);
}

function checkPromptTokens(n: number, param: string, limits: RequestLimits): void {
  if (n >= limits.maxModelLen) {
    throw new HandoffError(
      'PROMPT_TOO_LONG',
      `the prompt has ${n} tokens; this model takes at most ${limits.maxModelLen - 1} prompt tokens`,
      { param },
    );
  }
}

function checkedText(text: string, param: string, limits: RequestLimits): PromptInput {
  const max = promptCharsMax(limits);
  if (text.length > max) {
    throw new HandoffError(
      'PROMPT_TOO_LONG',
      `the prompt has ${text.length} characters; this model takes at most ${limits.maxModelLen - 1} prompt tokens, which is at most ${max} characters`,
      { param },
    );
  }
  return { text: wholeText(text, param), param };
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * `text` if it is whole characters. A JSON escape of half a surrogate pair (`"\ud83d"`) passes the body's
 * UTF-8 check but is no text: tokenized (UTF-8 encoded) it became U+FFFD, another prompt than the one sent.
 */
function wholeText(text: string, param: string): string {
  if (LONE_SURROGATE.test(text))
    throw bad(param, `${param} holds a lone UTF-16 surrogate (half of a pair, e.g. "\\ud83d"): it is not text`);
  return text;
}

/** /v1/completions `prompt`: a string, token ids, or a batch of exactly one of those. */
function promptOf(raw: unknown, limits: RequestLimits): PromptInput {
  if (raw === undefined || raw === null) throw bad('prompt', 'prompt is required');
  if (typeof raw === 'string') return raw.length === 0 ? notEmpty('prompt') : checkedText(raw, 'prompt', limits);
  if (!Array.isArray(raw)) throw bad('prompt', `prompt must be a string or a list of token ids, got ${preview(raw)}`);
  if (raw.length === 0) return notEmpty('prompt');
  if (typeof raw[0] === 'string' || Array.isArray(raw[0])) {
    if (raw.length > 1)
      throw bad('prompt', `prompt is a batch of ${raw.length} prompts; this server takes one prompt per request`);
    const only: unknown = raw[0];
    if (typeof only === 'string')
      return only.length === 0 ? notEmpty('prompt[0]') : checkedText(only, 'prompt[0]', limits);
    return tokenIds(only as unknown[], 'prompt[0]', limits);
  }
  return tokenIds(raw, 'prompt', limits);
}

function tokenIds(list: unknown[], param: string, limits: RequestLimits): PromptInput {
  if (list.length === 0) return notEmpty(param);
  checkPromptTokens(list.length, param, limits);
  list.forEach((id, i) => {
    if (typeof id !== 'number' || !Number.isInteger(id) || id < 0 || id >= VOCAB_SIZE) {
      throw bad(
        `${param}[${i}]`,
        `${param}[${i}] must be a token id (an integer in [0, ${VOCAB_SIZE - 1}]), got ${preview(id)}`,
      );
    }
  });
  return { ids: [...(list as number[])], param };
}

function notEmpty(param: string): never {
  throw bad(param, `${param} must not be empty`);
}

const KV_FIELDS = Object.keys(kvTransferParamsSchema.shape);

/**
 * `err` with a param when it has none: a refusal from below the serving edge (the engine's length
 * check, the connector's checks of kv_transfer_params, a grant denied at the READ) names the field it
 * is about, the first kv_transfer_params field its message mentions.
 */
export function attributeParam(err: HandoffError, kind: ApiKind): HandoffError {
  if (err.param !== null) return err;
  let param: string | null = null;
  if (err.code === 'PROMPT_TOO_LONG') param = kind === 'chat' ? 'messages' : 'prompt';
  if (err.code === 'BAD_TRANSFER_PARAMS' || err.code === 'GRANT_DENIED') {
    const field = KV_FIELDS.find((f) => new RegExp(`\\b${f}\\b`).test(err.message));
    param = field !== undefined ? `kv_transfer_params.${field}` : 'kv_transfer_params';
  }
  return param === null ? err : new HandoffError(err.code, err.message, { ...err.details, param });
}
