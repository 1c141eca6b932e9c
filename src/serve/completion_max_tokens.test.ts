/**
 * How /v1/completions resolves its output length, as vLLM's OpenAI server does
 * (completion/protocol.py: `max_tokens: int | None = 16`; completion/serving.py:
 * `get_max_tokens(max_model_len, request.max_tokens, prompt_len, ...)`, which takes `None` as "up to
 * max_model_len - prompt").
 *
 * Before the fix: an explicit `max_tokens: null` was read as "absent" and capped the answer at 16 tokens
 * (finish_reason length) where vLLM runs to the end of the context (as chat already did). Chat keeps
 * vLLM's `max_completion_tokens or max_tokens`.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { encode } from '../model/tokenizer.ts';
import { DEFAULT_COMPLETION_MAX_TOKENS, parseApiRequest } from './openai_request.ts';

const limits = { maxModelLen: 256 };
const prompt = 'Hello world';
const room = limits.maxModelLen - encode(prompt).length;

test('completions: absent max_tokens is 16, explicit null is the rest of the context (vLLM)', () => {
  assert.equal(parseApiRequest('completion', { prompt }, limits).maxTokens, DEFAULT_COMPLETION_MAX_TOKENS);
  const nul = parseApiRequest('completion', { prompt, max_tokens: null }, limits);
  assert.equal(nul.maxTokens, room, 'max_tokens: null must mean max_model_len - prompt, as in vLLM');
});

test('chat: max_completion_tokens wins over max_tokens; absent or null is the rest of the context', () => {
  const messages = [{ role: 'user', content: 'hi' }];
  assert.equal(parseApiRequest('chat', { messages, max_tokens: 3, max_completion_tokens: 5 }, limits).maxTokens, 5);
  assert.equal(parseApiRequest('chat', { messages, max_tokens: 3, max_completion_tokens: null }, limits).maxTokens, 3);
  const rest = parseApiRequest('chat', { messages }, limits);
  assert.equal(rest.maxTokens, limits.maxModelLen - rest.promptTokenIds.length);
  const nul = parseApiRequest('chat', { messages, max_tokens: null }, limits);
  assert.equal(nul.maxTokens, limits.maxModelLen - nul.promptTokenIds.length);
});
