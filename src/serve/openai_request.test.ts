/**
 * Request validation: every body either becomes a well-formed ApiRequest or a BAD_REQUEST /
 * PROMPT_TOO_LONG / BAD_TRANSFER_PARAMS HandoffError, never anything else (fast-check over arbitrary
 * JSON); over-long text is refused by its length before tokenizing; defaults follow OpenAI/vLLM; the
 * chat template is the documented ChatML. How refusals name their field, and the vLLM fields we refuse
 * or accept as neutral: openai_request_fields.test.ts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { HandoffError } from '../util/errors.ts';
import { encode } from '../model/tokenizer.ts';
import { applyChatTemplate } from './chat_template.ts';
import {
  attributeParam,
  DEFAULT_COMPLETION_MAX_TOKENS,
  parseApiRequest,
  parseApiRequestAsync,
  promptCharsMax,
  validateApiRequest,
} from './openai_request.ts';
import { code, limits, refusal } from './openai_request_testkit.ts';

test('completions: prompt forms, defaults, vLLM extensions', () => {
  const a = parseApiRequest('completion', { prompt: 'Hello world' }, limits);
  assert.deepEqual(a.promptTokenIds, encode('Hello world'));
  assert.equal(a.maxTokens, DEFAULT_COMPLETION_MAX_TOKENS);
  assert.equal(a.temperature, 1);
  assert.equal(a.seed, null);
  assert.equal(a.stream, false);
  assert.equal(a.includeUsage, false);
  assert.deepEqual(parseApiRequest('completion', { prompt: [5, 6, 7] }, limits).promptTokenIds, [5, 6, 7]);
  assert.deepEqual(
    parseApiRequest('completion', { prompt: ['Hello world'] }, limits).promptTokenIds,
    encode('Hello world'),
  );
  assert.deepEqual(parseApiRequest('completion', { prompt: [[9, 8]] }, limits).promptTokenIds, [9, 8]);
  const b = parseApiRequest(
    'completion',
    {
      prompt: 'x',
      max_tokens: 4,
      max_completion_tokens: 1,
      stop: 'END',
      stop_token_ids: [13],
      ignore_eos: true,
      top_k: 0,
      stream: true,
      stream_options: { include_usage: true },
      logprobs: 0,
      unknown_field: 1,
    },
    limits,
  );
  assert.equal(b.maxTokens, 1, 'max_completion_tokens wins, like the proxy sets both');
  assert.deepEqual(b.stop, ['END']);
  assert.deepEqual(b.stopTokenIds, [13]);
  assert.equal(b.topK, undefined, 'top_k 0 means off');
  assert.equal(b.includeUsage, true);
  assert.equal(b.logprobs, true);
  // A short room caps the completions default.
  assert.equal(parseApiRequest('completion', { prompt: Array.from({ length: 120 }, () => 1) }, limits).maxTokens, 8);
});

test('chat: the fixed ChatML template, text parts joined by a newline (as vLLM), default max_tokens = the rest of the context', () => {
  const messages = [
    { role: 'system', content: 'Be brief.' },
    {
      role: 'user',
      content: [
        { type: 'text', text: 'Hi' },
        { type: 'text', text: 'there' },
      ],
    },
  ];
  const r = parseApiRequest('chat', { messages, logprobs: true }, limits);
  const text =
    '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n';
  assert.equal(
    applyChatTemplate([
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Hi\nthere' },
    ]),
    text,
  );
  assert.deepEqual(r.promptTokenIds, encode(text));
  assert.equal(r.maxTokens, limits.maxModelLen - r.promptTokenIds.length);
  assert.equal(r.logprobs, true);
});

test('wrong types, ranges and unsupported features are BAD_REQUEST; long prompts PROMPT_TOO_LONG', () => {
  const bad: Array<[string, unknown, string]> = [
    ['completion', {}, 'BAD_REQUEST'],
    ['completion', { prompt: '' }, 'BAD_REQUEST'],
    ['completion', { prompt: [] }, 'BAD_REQUEST'],
    ['completion', { prompt: [1.5] }, 'BAD_REQUEST'],
    ['completion', { prompt: [-1] }, 'BAD_REQUEST'],
    ['completion', { prompt: ['a', 'b'] }, 'BAD_REQUEST'],
    ['completion', { prompt: 'x', max_tokens: 0 }, 'BAD_REQUEST'],
    ['completion', { prompt: 'x', max_tokens: 129 }, 'BAD_REQUEST'],
    ['completion', { prompt: 'x', max_tokens: 2.5 }, 'BAD_REQUEST'],
    ['completion', { prompt: 'x', temperature: 3 }, 'BAD_REQUEST'],
    ['completion', { prompt: 'x', top_p: 0 }, 'BAD_REQUEST'],
    ['completion', { prompt: 'x', seed: 1.5 }, 'BAD_REQUEST'],
    ['completion', { prompt: 'x', n: 3 }, 'BAD_REQUEST'],
    ['completion', { prompt: 'x', echo: true }, 'BAD_REQUEST'],
    ['completion', { prompt: 'x', presence_penalty: 0.5 }, 'BAD_REQUEST'],
    ['completion', { prompt: 'x', stop: [''] }, 'BAD_REQUEST'],
    ['completion', { prompt: 'x', stream: 'yes' }, 'BAD_REQUEST'],
    ['completion', { prompt: 'x', kv_transfer_params: { remote_port: 70000 } }, 'BAD_TRANSFER_PARAMS'],
    ['completion', { prompt: 'x', kv_transfer_params: { grant: 'not-hex' } }, 'BAD_TRANSFER_PARAMS'],
    ['completion', { prompt: Array.from({ length: 128 }, () => 1) }, 'PROMPT_TOO_LONG'],
    ['completion', { prompt: Array.from({ length: 100 }, () => 1), max_tokens: 29 }, 'PROMPT_TOO_LONG'],
    ['chat', { messages: [] }, 'BAD_REQUEST'],
    ['chat', { messages: [{ role: 'wizard', content: 'x' }] }, 'BAD_REQUEST'],
    ['chat', { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: 'x' }] }] }, 'BAD_REQUEST'],
    ['chat', { messages: [{ role: 'user', content: 'x' }], top_logprobs: 2 }, 'BAD_REQUEST'],
  ];
  for (const [kind, body, want] of bad)
    assert.equal(
      code(() => parseApiRequest(kind as 'chat', body, limits)),
      want,
      JSON.stringify(body).slice(0, 80),
    );
});

test('property: any JSON body is either accepted consistently or refused with a typed 4xx error', () => {
  const field = fc.oneof(fc.constant(undefined), fc.jsonValue(), fc.integer({ min: -5, max: 200 }), fc.string());
  const body = fc.record(
    {
      prompt: fc.oneof(fc.string(), fc.array(fc.integer({ min: -2, max: 60000 }), { maxLength: 140 }), fc.jsonValue()),
      max_tokens: field,
      temperature: field,
      n: field,
      stop: field,
      kv_transfer_params: field,
      stream: field,
    },
    { requiredKeys: [] },
  );
  fc.assert(
    fc.property(body, (b) => {
      try {
        const r = parseApiRequest('completion', b, limits);
        assert.ok(r.promptTokenIds.length > 0 && r.promptTokenIds.length < limits.maxModelLen);
        assert.ok(Number.isInteger(r.maxTokens) && r.maxTokens >= 1);
        assert.ok(r.promptTokenIds.length + r.maxTokens <= limits.maxModelLen, 'prompt + output fit the model');
      } catch (e) {
        assert.ok(e instanceof HandoffError, String(e));
        assert.ok(e.httpStatus >= 400 && e.httpStatus < 500, e.code);
      }
    }),
    { numRuns: 300 },
  );
});

test('over-long text is refused by its length before tokenizing, and never a prompt that fits', () => {
  const max = promptCharsMax(limits);
  assert.equal(max, (limits.maxModelLen - 1) * 128, 'no GPT-2 token is longer than 128 bytes');
  // One character more than can possibly fit: refused by validation alone (it never tokenizes).
  for (const body of [{ prompt: 'a'.repeat(max + 1) }, { prompt: ['a'.repeat(max + 1)] }]) {
    const e = refusal(() => validateApiRequest('completion', body, limits));
    assert.equal(e?.code, 'PROMPT_TOO_LONG');
    assert.match(e.message, new RegExp(`has ${max + 1} characters; .* at most ${max} characters`));
  }
  const chat = refusal(() =>
    validateApiRequest(
      'chat',
      {
        messages: [
          { role: 'user', content: 'b'.repeat(max / 2) },
          { role: 'user', content: 'c'.repeat(max / 2) },
        ],
      },
      limits,
    ),
  );
  assert.equal(chat?.code, 'PROMPT_TOO_LONG', 'chat: the messages together');
  assert.equal(chat.param, 'messages');
  // At the bound the text is tokenized; 'a' × max is 4 characters a token, so it is refused by tokens.
  assert.deepEqual(validateApiRequest('completion', { prompt: 'a'.repeat(max) }, limits).prompt, {
    text: 'a'.repeat(max),
    param: 'prompt',
  });
  assert.match(
    refusal(() => parseApiRequest('completion', { prompt: 'a'.repeat(max) }, limits))?.message ?? '',
    /has 4064 tokens/,
  );
  // Token ids are counted, not tokenized.
  assert.equal(
    code(() => validateApiRequest('completion', { prompt: Array(limits.maxModelLen).fill(1) }, limits)),
    'PROMPT_TOO_LONG',
  );
});

test('parseApiRequestAsync tokenizes text with the given encoder (and only text); refusals from below get a param', async () => {
  const seen: string[] = [];
  const enc = async (t: string): Promise<number[]> => (seen.push(t), encode(t));
  assert.deepEqual(
    (await parseApiRequestAsync('completion', { prompt: 'Hello world' }, limits, enc)).promptTokenIds,
    encode('Hello world'),
  );
  assert.deepEqual((await parseApiRequestAsync('completion', { prompt: [1, 2] }, limits, enc)).promptTokenIds, [1, 2]);
  assert.deepEqual(seen, ['Hello world']);
  await assert.rejects(
    parseApiRequestAsync('completion', { prompt: 'x', max_tokens: 0 }, limits, enc),
    (e: HandoffError) => e.param === 'max_tokens',
  );
  const grant = attributeParam(new HandoffError('GRANT_DENIED', 'grant denied by prefill-1: expired'), 'completion');
  assert.equal(grant.param, 'kv_transfer_params.grant');
  assert.equal(
    attributeParam(
      new HandoffError('BAD_TRANSFER_PARAMS', 'remote_block_ids group 0 has 9 blocks, the prompt needs at most 4'),
      'chat',
    ).param,
    'kv_transfer_params.remote_block_ids',
  );
  assert.equal(attributeParam(new HandoffError('PROMPT_TOO_LONG', 'too long'), 'chat').param, 'messages');
  assert.equal(attributeParam(new HandoffError('OUT_OF_PAGES', 'full'), 'chat').param, null);
});
