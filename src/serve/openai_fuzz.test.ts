/**
 * Fuzz of a live instance server (in process, colocated, on the sim device) through both endpoints:
 * every field we know of, and every vLLM/OpenAI field we refuse, gets random values of random types
 * (mostly plausible ones, so many requests really generate), plus random extra fields and nesting.
 * Proves: every answer is 2xx or 4xx, never 5xx; a 4xx is a well-formed OpenAI error JSON (stable code,
 * message, param); a 200 is a completion (or an SSE stream ending in [DONE]); and afterwards /health is
 * 200, a normal request succeeds and every page is back in the pool.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { RealEnv } from '../util/env.ts';
import { ERROR_CODES } from '../util/errors.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance } from './instance.ts';
import { refusableFields } from './request_fields.ts';
import { SseParser } from './sse.ts';

const env = new RealEnv(11);
const NUM_BLOCKS = 128;
const MAX_MODEL_LEN = 128;
const RUNS = 150;
let inst: Instance;

before(async () => {
  inst = await startInstance(
    {
      ...DEFAULT_INSTANCE_OPTIONS,
      port: 0,
      device: 'sim',
      numBlocks: NUM_BLOCKS,
      scheduler: { maxModelLen: MAX_MODEL_LEN },
    },
    env,
  );
});

after(async () => {
  await inst.close();
});

const junk: fc.Arbitrary<unknown> = fc.oneof(
  fc.jsonValue({ maxDepth: 3 }),
  fc.constantFrom(
    null,
    true,
    false,
    0,
    -1,
    1,
    2,
    1.5,
    1e9,
    -1e9,
    '',
    'x',
    [],
    {},
    [[]],
    [null],
    { type: 'text' },
    'dsv4-mini',
  ),
  fc.string({ maxLength: 30 }),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
  fc.array(fc.integer({ min: -5, max: 60_000 }), { maxLength: 80 }),
);
const shortText = fc.string({ unit: 'grapheme', minLength: 1, maxLength: 20 });
const tokenIds = fc.array(fc.integer({ min: 0, max: 50_256 }), { minLength: 1, maxLength: 30 });
const stopText = fc.string({ minLength: 1, maxLength: 4 });

/** Valid values of every field we implement (each present or not), so unmutated bodies really generate. */
const plausibleCommon = {
  model: fc.constantFrom('dsv4-mini', null),
  max_tokens: fc.integer({ min: 1, max: 4 }),
  max_completion_tokens: fc.integer({ min: 1, max: 4 }),
  temperature: fc.double({ min: 0, max: 2, noNaN: true }),
  top_p: fc.double({ min: 0.01, max: 1, noNaN: true }),
  top_k: fc.integer({ min: -1, max: 100 }),
  seed: fc.integer(),
  stop: fc.oneof(stopText, fc.array(stopText, { maxLength: 4 })),
  stop_token_ids: fc.array(fc.integer({ min: 0, max: 50_256 }), { maxLength: 4 }),
  include_stop_str_in_output: fc.boolean(),
  stream: fc.boolean(),
  stream_options: fc.record(
    { include_usage: fc.boolean(), continuous_usage_stats: fc.constantFrom(false, null) },
    { requiredKeys: [] },
  ),
  ignore_eos: fc.boolean(),
  return_token_ids: fc.boolean(),
  user: fc.string({ maxLength: 10 }),
  metadata: fc.dictionary(fc.string({ maxLength: 5 }), fc.string({ maxLength: 5 }), { maxKeys: 3 }),
  store: fc.boolean(),
};
const plausible = {
  completion: fc.record(
    {
      ...plausibleCommon,
      prompt: fc.oneof(
        shortText,
        tokenIds,
        shortText.map((t) => [t]),
        tokenIds.map((t) => [t]),
      ),
      logprobs: fc.constantFrom(0, null),
      echo: fc.constant(false),
    },
    { requiredKeys: ['prompt'] },
  ),
  chat: fc.record(
    {
      ...plausibleCommon,
      messages: fc.array(
        fc.record({
          role: fc.constantFrom('system', 'developer', 'user', 'assistant', 'tool'),
          content: fc.oneof(
            shortText,
            fc.array(fc.record({ type: fc.constant('text'), text: shortText }), { maxLength: 3 }),
          ),
        }),
        { minLength: 1, maxLength: 3 },
      ),
      logprobs: fc.boolean(),
      top_logprobs: fc.constantFrom(0, null),
    },
    { requiredKeys: ['messages'] },
  ),
};

const kvTransferParams = fc.record(
  {
    do_remote_decode: fc.oneof(fc.boolean(), junk),
    do_remote_prefill: fc.oneof(fc.boolean(), junk),
    remote_engine_id: junk,
    remote_block_ids: fc.oneof(
      fc.array(fc.array(fc.nat(300), { maxLength: 6 }), { maxLength: 3 }),
      fc.array(fc.nat(300), { maxLength: 6 }),
      junk,
    ),
    remote_host: junk,
    remote_port: fc.oneof(fc.integer({ min: -1, max: 70_000 }), junk),
    transfer_id: junk,
    grant: fc.oneof(fc.stringMatching(/^[0-9a-f]{32}$/), junk),
    remote_num_tokens: junk,
  },
  { requiredKeys: [] },
);

/**
 * What a body gets on top of its valid fields: nothing; junk (any type, nested) in one or two fields
 * we implement; one or two fields we refuse (neutral-looking or junk); random kv_transfer_params.
 */
function mutation(kind: 'completion' | 'chat'): fc.Arbitrary<Record<string, unknown>> {
  const known = [
    ...Object.keys(plausibleCommon),
    ...(kind === 'chat' ? ['messages', 'logprobs', 'top_logprobs'] : ['prompt', 'logprobs', 'echo']),
  ];
  const refusedValue = fc.oneof(
    fc.constantFrom(null, 0, 1, true, false, [], {}, 'none', 'auto', { type: 'text' }, ['text']),
    junk,
  );
  return fc.oneof(
    { arbitrary: fc.constant({}), weight: 3 },
    { arbitrary: fc.dictionary(fc.constantFrom(...known), junk, { minKeys: 1, maxKeys: 2 }), weight: 3 },
    {
      arbitrary: fc.dictionary(fc.constantFrom(...refusableFields(kind)), refusedValue, { minKeys: 1, maxKeys: 2 }),
      weight: 2,
    },
    { arbitrary: kvTransferParams.map((p) => ({ kv_transfer_params: p })), weight: 1 },
  );
}

/** Random extra fields, some nested, that no one defines. */
const extras = fc.dictionary(fc.string({ maxLength: 12 }), junk, { maxKeys: 3 });

const body = (kind: 'completion' | 'chat'): fc.Arbitrary<Record<string, unknown>> =>
  fc
    .tuple(plausible[kind], mutation(kind), extras)
    .map(([valid, mutated, extra]) => ({ ...extra, ...withoutStrayStreamOptions(valid), ...mutated }));

/** stream_options without stream is refused (as vLLM does): a valid body only has it when streaming. */
function withoutStrayStreamOptions(b: Record<string, unknown>): Record<string, unknown> {
  if (b['stream'] === true) return b;
  const { stream_options: _, ...rest } = b;
  return rest;
}

const outcomes = new Map<string, number>();

async function check(path: string, body: unknown): Promise<void> {
  const r = await fetch(`${inst.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(30_000),
  });
  const text = await r.text();
  const what = `${r.status} for ${JSON.stringify(body).slice(0, 400)} → ${text.slice(0, 300)}`;
  assert.ok(r.status < 500, `a 5xx: ${what}`);
  if (r.status >= 400) {
    const e = (JSON.parse(text) as { error: { message: unknown; type: unknown; code: unknown; param: unknown } }).error;
    assert.ok(typeof e.code === 'string' && e.code in ERROR_CODES, what);
    assert.equal(e.type, 'invalid_request_error', what);
    assert.ok(typeof e.message === 'string' && e.message.length > 0 && !/^Invalid input/.test(e.message), what);
    assert.ok(e.param === null || typeof e.param === 'string', what);
    count(`${path} ${String(e.code)} ${String(e.param).replace(/\[\d+\]/g, '[i]')}`);
    return;
  }
  assert.equal(r.status, 200, what);
  if ((r.headers.get('content-type') ?? '').startsWith('text/event-stream')) {
    const events = new SseParser().push(text);
    assert.equal(events.at(-1), '[DONE]', what);
  } else {
    assert.equal((JSON.parse(text) as { choices: unknown[] }).choices.length, 1, what);
  }
  count(`${path} 200`);
}

function count(outcome: string): void {
  outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
}

test('fuzz /v1/completions: every field, random types, extra fields: 2xx or a well-formed 4xx, never 5xx', async () => {
  await fc.assert(
    fc.asyncProperty(body('completion'), (b) => check('/v1/completions', b)),
    { numRuns: RUNS },
  );
});

test('fuzz /v1/chat/completions: every field, random types, extra fields: 2xx or a well-formed 4xx, never 5xx', async () => {
  await fc.assert(
    fc.asyncProperty(body('chat'), (b) => check('/v1/chat/completions', b)),
    { numRuns: RUNS },
  );
});

test('after the fuzz: /health is 200, a normal request succeeds, every page is back', async () => {
  const top = [...outcomes].sort((a, b) => b[1] - a[1]);
  console.log(
    `# ${top.length} distinct outcomes; most frequent: ${top
      .slice(0, 12)
      .map(([k, n]) => `${k}: ${n}`)
      .join('; ')}`,
  );
  for (const path of ['/v1/completions', '/v1/chat/completions'])
    assert.ok((outcomes.get(`${path} 200`) ?? 0) >= RUNS / 10, `${path}: many fuzzed requests really generated`);
  assert.equal((await fetch(`${inst.url}/health`)).status, 200);
  const r = await fetch(`${inst.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'still fine', max_tokens: 3 }),
  });
  assert.equal(r.status, 200);
  for (let k = 0; k < 2000 && !inst.engine.core.isIdle(); k++) await env.sleep(5);
  assert.ok(inst.engine.core.isIdle(), 'engine idle');
  assert.equal(inst.engine.kv.getNumFreeBlocks(), NUM_BLOCKS - 1, 'no page leaked');
});
