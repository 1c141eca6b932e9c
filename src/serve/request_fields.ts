/**
 * Request fields that OpenAI or vLLM define and this server does not implement. A client that sets one
 * expects its effect, so ignoring it would silently change the answer: each is refused with a
 * BAD_REQUEST naming it, unless its value is the neutral one (the value that changes nothing, e.g.
 * repetition_penalty 1, min_tokens 0); null and absent are always neutral. Fields we do not know at
 * all are ignored, like vLLM does (OpenAI's own harmless `user`, `metadata`, `store` are typed in the
 * request schema and ignored).
 */
import { HandoffError } from '../util/errors.ts';
import type { ApiKind } from './openai_request.ts';

interface NeutralRule {
  neutral: (v: unknown) => boolean;
  /** The accepted values, for the message. */
  only: string;
}

const is = (x: unknown, only = JSON.stringify(x)): NeutralRule => ({ neutral: (v) => v === x, only });
const nullOnly: NeutralRule = { neutral: () => false, only: 'null' };
const emptyList: NeutralRule = { neutral: (v) => Array.isArray(v) && v.length === 0, only: '[]' };
const emptyObject: NeutralRule = {
  neutral: (v) => v !== null && typeof v === 'object' && !Array.isArray(v) && Object.keys(v).length === 0,
  only: '{}',
};
const anyBoolean: NeutralRule = { neutral: (v) => typeof v === 'boolean', only: 'true or false' };
const oneOf = (...xs: string[]): NeutralRule => ({
  neutral: (v) => typeof v === 'string' && xs.includes(v),
  only: xs.map((x) => JSON.stringify(x)).join(' or '),
});

/** Both endpoints. */
const COMMON: Record<string, NeutralRule> = {
  n: is(1),
  best_of: is(1),
  presence_penalty: is(0),
  frequency_penalty: is(0),
  logit_bias: emptyObject,
  response_format: {
    neutral: (v) => (v as { type?: unknown } | null)?.type === 'text' && Object.keys(v as object).length === 1,
    only: '{"type": "text"}',
  },
  // vLLM's sampling extensions.
  use_beam_search: is(false),
  min_tokens: is(0),
  min_p: is(0),
  repetition_penalty: is(1),
  length_penalty: is(1),
  skip_special_tokens: is(true),
  spaces_between_special_tokens: is(true),
  truncate_prompt_tokens: nullOnly,
  prompt_logprobs: nullOnly,
  allowed_token_ids: nullOnly,
  bad_words: emptyList,
  logits_processors: nullOnly,
  return_tokens_as_token_ids: is(false),
  // GPT-2's encoder adds no special tokens either way.
  add_special_tokens: anyBoolean,
  // Structured output.
  guided_json: nullOnly,
  guided_regex: nullOnly,
  guided_choice: nullOnly,
  guided_grammar: nullOnly,
  guided_whitespace_pattern: nullOnly,
  guided_decoding_backend: nullOnly,
  structured_outputs: nullOnly,
  // Scheduling and caching.
  priority: is(0),
  request_id: { ...nullOnly, only: 'null (send the X-Request-Id header instead)' },
  cache_salt: nullOnly,
  vllm_xargs: nullOnly,
  prompt_embeds: nullOnly,
};

const COMPLETION: Record<string, NeutralRule> = {
  ...COMMON,
  echo: is(false),
  suffix: nullOnly,
};

const CHAT: Record<string, NeutralRule> = {
  ...COMMON,
  tools: emptyList,
  tool_choice: oneOf('none', 'auto'),
  functions: emptyList,
  function_call: oneOf('none', 'auto'),
  // Harmless without tools.
  parallel_tool_calls: anyBoolean,
  reasoning_effort: nullOnly,
  // Only meaningful with a reasoning parser, which this server does not have.
  include_reasoning: anyBoolean,
  echo: is(false),
  add_generation_prompt: is(true),
  continue_final_message: is(false),
  chat_template: nullOnly,
  chat_template_kwargs: emptyObject,
  documents: nullOnly,
  mm_processor_kwargs: nullOnly,
  modalities: { neutral: (v) => Array.isArray(v) && v.length === 1 && v[0] === 'text', only: '["text"]' },
  audio: nullOnly,
  prediction: nullOnly,
  web_search_options: nullOnly,
};

/** Names this module refuses unless neutral (tests enumerate them). */
export function refusableFields(kind: ApiKind): string[] {
  return Object.keys(kind === 'chat' ? CHAT : COMPLETION);
}

/** Throws BAD_REQUEST (param = the field) for the first field set to a value we would not honour. */
export function refuseUnsupportedFields(kind: ApiKind, body: Record<string, unknown>): void {
  const rules = kind === 'chat' ? CHAT : COMPLETION;
  for (const [field, rule] of Object.entries(rules)) {
    if (!Object.hasOwn(body, field)) continue;
    const v = body[field];
    if (v === null || v === undefined || rule.neutral(v)) continue;
    throw new HandoffError('BAD_REQUEST', `${field} is not supported by this server (only ${rule.only} is accepted)`, {
      param: field,
    });
  }
}
