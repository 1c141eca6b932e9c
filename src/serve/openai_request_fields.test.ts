/**
 * Request validation, refused and neutral fields: every refusal names its field (`param`) and says what
 * is wrong in the client's terms (never a bare zod message); vLLM fields we do not implement are refused
 * by name unless neutral, and harmless OpenAI fields are accepted.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { parseApiRequest } from './openai_request.ts';
import { code, limits, refusal } from './openai_request_testkit.ts';
import { refusableFields } from './request_fields.ts';

test("every refusal names its field (param) and says what is wrong, in the client's terms", () => {
  const user = [{ role: 'user', content: 'x' }];
  const cases: Array<[string, unknown, string, string | null, RegExp]> = [
    ['completion', {}, 'BAD_REQUEST', 'prompt', /prompt is required/],
    ['completion', { prompt: 5 }, 'BAD_REQUEST', 'prompt', /prompt must be a string or a list of token ids, got 5/],
    ['completion', { prompt: '' }, 'BAD_REQUEST', 'prompt', /must not be empty/],
    ['completion', { prompt: [3, 1.5] }, 'BAD_REQUEST', 'prompt[1]', /prompt\[1\] must be a token id .* got 1\.5/],
    ['completion', { prompt: [[7, -1]] }, 'BAD_REQUEST', 'prompt[0][1]', /got -1/],
    ['completion', { prompt: ['a', 'b'] }, 'BAD_REQUEST', 'prompt', /batch of 2 prompts/],
    [
      'completion',
      { prompt: Array(100_000).fill(1) },
      'PROMPT_TOO_LONG',
      'prompt',
      /the prompt has 100000 tokens; this model takes at most 127/,
    ],
    ['completion', { prompt: 'x', max_tokens: 0 }, 'BAD_REQUEST', 'max_tokens', /max_tokens must be at least 1, got 0/],
    [
      'completion',
      { prompt: 'x', max_tokens: 'many' },
      'BAD_REQUEST',
      'max_tokens',
      /max_tokens must be a number, got "many"/,
    ],
    [
      'completion',
      { prompt: 'x', max_completion_tokens: 129 },
      'BAD_REQUEST',
      'max_completion_tokens',
      /\[1, 128\].*got 129/,
    ],
    [
      'completion',
      { prompt: 'x', temperature: 3 },
      'BAD_REQUEST',
      'temperature',
      /temperature must be at most 2, got 3/,
    ],
    ['completion', { prompt: 'x', top_p: 0 }, 'BAD_REQUEST', 'top_p', /top_p must be greater than 0/],
    ['completion', { prompt: 'x', stop: 5 }, 'BAD_REQUEST', 'stop', /stop must be a string or a list of strings/],
    ['completion', { prompt: 'x', stop: ['ok', ''] }, 'BAD_REQUEST', 'stop[1]', /stop\[1\] must not be empty/],
    [
      'completion',
      { prompt: 'x', stop: Array(17).fill('a') },
      'BAD_REQUEST',
      'stop',
      /stop has 17 entries; at most 16/,
    ],
    ['completion', { prompt: 'x', stream: 'yes' }, 'BAD_REQUEST', 'stream', /stream must be true or false, got "yes"/],
    ['completion', { prompt: 'x', logprobs: 3 }, 'BAD_REQUEST', 'logprobs', /logprobs: 0/],
    [
      'completion',
      { prompt: 'x', stream_options: { continuous_usage_stats: true } },
      'BAD_REQUEST',
      'stream_options.continuous_usage_stats',
      /not supported/,
    ],
    [
      'completion',
      { prompt: 'x', kv_transfer_params: 'yes' },
      'BAD_TRANSFER_PARAMS',
      'kv_transfer_params',
      /kv_transfer_params must be an object, got "yes"/,
    ],
    [
      'completion',
      { prompt: 'x', kv_transfer_params: { remote_port: 70000 } },
      'BAD_TRANSFER_PARAMS',
      'kv_transfer_params.remote_port',
      /remote_port must be at most 65535, got 70000/,
    ],
    [
      'completion',
      { prompt: 'x', kv_transfer_params: { grant: 'not-hex' } },
      'BAD_TRANSFER_PARAMS',
      'kv_transfer_params.grant',
      /hex/,
    ],
    [
      'completion',
      { prompt: 'x', kv_transfer_params: { remote_block_ids: Array(100_000).fill(3) } },
      'BAD_TRANSFER_PARAMS',
      'kv_transfer_params.remote_block_ids',
      /remote_block_ids has 100000 entries; at most 65536/,
    ],
    [
      'completion',
      { prompt: 'x', kv_transfer_params: { remote_block_ids: Array(100).fill([1]) } },
      'BAD_TRANSFER_PARAMS',
      'kv_transfer_params.remote_block_ids',
      /has 100 groups; at most 64/,
    ],
    [
      'completion',
      {
        prompt: 'x',
        kv_transfer_params: {
          remote_block_ids: [
            [1, 2],
            [3, -4],
          ],
        },
      },
      'BAD_TRANSFER_PARAMS',
      'kv_transfer_params.remote_block_ids[1][1]',
      /must be a page id .* got -4/,
    ],
    [
      'completion',
      { prompt: 'x', kv_transfer_params: { remote_block_ids: [[1], 'x'] } },
      'BAD_TRANSFER_PARAMS',
      'kv_transfer_params.remote_block_ids[1]',
      /must be a list of page ids/,
    ],
    ['chat', { messages: [] }, 'BAD_REQUEST', 'messages', /messages must not be empty/],
    ['chat', { messages: 'hi' }, 'BAD_REQUEST', 'messages', /messages must be a list, got "hi"/],
    [
      'chat',
      { messages: [{ role: 'wizard', content: 'x' }] },
      'BAD_REQUEST',
      'messages[0].role',
      /must be one of "system", .* got "wizard"/,
    ],
    [
      'chat',
      { messages: [...user, { role: 'user' }] },
      'BAD_REQUEST',
      'messages[1].content',
      /messages\[1\]\.content is required/,
    ],
    [
      'chat',
      { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: 'x' }] }] },
      'BAD_REQUEST',
      'messages[0].content[0].type',
      /must be "text", got "image_url"/,
    ],
    ['chat', { messages: user, top_logprobs: 2 }, 'BAD_REQUEST', 'top_logprobs', /top_logprobs must be 0/],
    ['chat', { messages: user, metadata: 5 }, 'BAD_REQUEST', 'metadata', /metadata must be an object/],
    [
      'chat',
      { messages: user, tools: [{ type: 'function', function: { name: 'f' } }] },
      'BAD_REQUEST',
      'tools',
      /tools is not supported by this server/,
    ],
  ];
  for (const [kind, body, want, param, message] of cases) {
    const what = JSON.stringify(body).slice(0, 80);
    const e = refusal(() => parseApiRequest(kind as 'chat', body, limits));
    assert.ok(e, `${what} was accepted`);
    assert.equal(e.code, want, what);
    assert.equal(e.param, param, what);
    assert.match(e.message, message, what);
    assert.deepEqual(e.toJSON().error.param, param, 'param reaches the wire');
  }
});

test('property: no refusal is a bare zod message ("Invalid input", "Too big: ...") and each names a field or the body', () => {
  const anyValue = fc.oneof(
    fc.jsonValue(),
    fc.array(fc.integer({ min: -3, max: 60_000 }), { maxLength: 200 }),
    fc.string({ maxLength: 300 }),
  );
  const completion = fc.dictionary(
    fc.constantFrom(
      'prompt',
      'max_tokens',
      'stop',
      'temperature',
      'top_p',
      'seed',
      'stream_options',
      'kv_transfer_params',
      'logprobs',
      'stop_token_ids',
      'user',
      'metadata',
    ),
    anyValue,
  );
  const params = fc.dictionary(
    fc.constantFrom(
      'remote_block_ids',
      'remote_port',
      'grant',
      'remote_engine_id',
      'do_remote_prefill',
      'remote_num_tokens',
    ),
    anyValue,
  );
  const chat = fc.record(
    {
      messages: fc.oneof(
        anyValue,
        fc.array(
          fc.dictionary(fc.constantFrom('role', 'content'), fc.oneof(anyValue, fc.constantFrom('user', 'tool'))),
          { maxLength: 3 },
        ),
      ),
      kv_transfer_params: params,
    },
    { requiredKeys: [] },
  );
  const check = (kind: 'completion' | 'chat', body: unknown): void => {
    const e = refusal(() => parseApiRequest(kind, body, limits));
    if (e === null) return;
    assert.ok(e.httpStatus >= 400 && e.httpStatus < 500, e.code);
    assert.doesNotMatch(e.message, /Invalid input|Too (big|small)|Invalid option|expected .* received/, e.message);
    assert.ok(e.param !== null, `a param for: ${e.message}`);
    assert.ok(
      e.message.includes(e.param.split(/[.[]/)[0] ?? '') || e.code === 'PROMPT_TOO_LONG',
      `the message names ${e.param}: ${e.message}`,
    );
  };
  fc.assert(
    fc.property(completion, (b) => check('completion', { prompt: 'x', ...b })),
    { numRuns: 400 },
  );
  fc.assert(
    fc.property(chat, (b) => check('chat', b)),
    { numRuns: 300 },
  );
});

test('vLLM fields we do not implement: refused by name unless neutral; harmless OpenAI fields accepted', () => {
  const user = [{ role: 'user', content: 'x' }];
  const base = { completion: { prompt: 'x' }, chat: { messages: user } } as const;
  for (const kind of ['completion', 'chat'] as const) {
    for (const field of refusableFields(kind)) {
      // A value no field treats as neutral (not null, not the default).
      const e = refusal(() => parseApiRequest(kind, { ...base[kind], [field]: 'something-else' }, limits));
      assert.ok(e, `${kind}: ${field} = "something-else" was accepted`);
      assert.equal(e.code, 'BAD_REQUEST');
      assert.equal(e.param, field);
      assert.match(e.message, new RegExp(`^${field} is not supported by this server \\(only .+ is accepted\\)$`));
      assert.equal(
        code(() => parseApiRequest(kind, { ...base[kind], [field]: null }, limits)),
        'ok',
        `${field}: null is neutral`,
      );
    }
    assert.equal(
      code(() => parseApiRequest(kind, { ...base[kind], min_p: 0.05 }, limits)),
      'BAD_REQUEST',
    );
    assert.equal(
      code(() => parseApiRequest(kind, { ...base[kind], repetition_penalty: 1.2 }, limits)),
      'BAD_REQUEST',
    );
    const neutral = {
      min_tokens: 0,
      min_p: 0,
      repetition_penalty: 1,
      length_penalty: 1,
      use_beam_search: false,
      skip_special_tokens: true,
      bad_words: [],
      logit_bias: {},
      response_format: { type: 'text' },
      n: 1,
      best_of: 1,
      presence_penalty: 0,
      frequency_penalty: 0,
      priority: 0,
      add_special_tokens: false,
    };
    const harmless = { user: 'u-1', metadata: { team: 'a' }, store: false, some_future_field: { nested: [1] } };
    assert.equal(
      code(() => parseApiRequest(kind, { ...base[kind], ...neutral, ...harmless }, limits)),
      'ok',
      `${kind}: neutral values are accepted`,
    );
  }
  assert.equal(
    code(() =>
      parseApiRequest(
        'chat',
        { messages: user, tools: [], tool_choice: 'none', parallel_tool_calls: false, add_generation_prompt: true },
        limits,
      ),
    ),
    'ok',
  );
  assert.equal(
    code(() => parseApiRequest('chat', { messages: user, tool_choice: 'required' }, limits)),
    'BAD_REQUEST',
  );
  assert.equal(
    code(() => parseApiRequest('completion', { prompt: 'x', echo: true }, limits)),
    'BAD_REQUEST',
  );
  for (const include of [true, false])
    assert.equal(
      parseApiRequest('completion', { prompt: 'x', include_stop_str_in_output: include }, limits).includeStopStr,
      include,
      'honoured',
    );
});
