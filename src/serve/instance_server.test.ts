/**
 * The instance server over HTTP, in process (colocated engine on the in-process sim device):
 * OpenAI response and SSE shapes, validation errors as 4xx OpenAI JSON naming the field (`param`) with
 * the server still serving, vLLM fields refused by name, API key, X-Request-Id, stop strings (and
 * include_stop_str_in_output), client disconnect freeing pages, and /metrics.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { request as httpRequest } from 'node:http';
import OpenAI from 'openai';
import { RealEnv } from '../util/env.ts';
import { encode } from '../model/tokenizer.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance } from './instance.ts';
import { SseParser } from './sse.ts';
import { toHandoffError } from './http_io.ts';
import { AssertionFailure } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';

let inst: Instance;
let keyed: Instance;
const env = new RealEnv(7);

before(async () => {
  const base = {
    ...DEFAULT_INSTANCE_OPTIONS,
    port: 0,
    device: 'sim' as const,
    numBlocks: 160,
    scheduler: { maxModelLen: 512 },
  };
  // The threaded device: its steps leave the event loop free, so a disconnect is seen mid-generation.
  inst = await startInstance({ ...base, device: 'threaded' }, env);
  keyed = await startInstance({ ...base, apiKey: 'sekrit' }, env);
});

after(async () => {
  await inst.close();
  await keyed.close();
});

async function post(
  path: string,
  body: unknown,
  headers: Record<string, string> = {},
  url = inst.url,
): Promise<{ status: number; json: any; headers: Headers; text: string }> {
  const r = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json: unknown = null;
  try {
    json = JSON.parse(text);
  } catch {
    json = null;
  }
  return { status: r.status, json, headers: r.headers, text };
}

async function waitIdle(i: Instance): Promise<void> {
  for (let k = 0; k < 2000 && !i.engine.core.isIdle(); k++) await env.sleep(5);
  assert.ok(i.engine.core.isIdle(), 'engine idle');
}

test('completions: OpenAI shape, usage, token ids, logprobs; the same seed gives the same tokens', async () => {
  const body = {
    model: 'dsv4-mini',
    prompt: 'Hello there',
    max_tokens: 6,
    temperature: 0.8,
    seed: 42,
    ignore_eos: true,
    logprobs: 0,
    return_token_ids: true,
  };
  const a = await post('/v1/completions', body);
  const b = await post('/v1/completions', body);
  assert.equal(a.status, 200, a.text);
  const c = a.json.choices[0];
  assert.equal(a.json.object, 'text_completion');
  assert.equal(c.finish_reason, 'length');
  assert.equal(c.token_ids.length, 6);
  assert.deepEqual(c.prompt_token_ids, encode('Hello there'));
  assert.equal(c.logprobs.token_logprobs.length, 6);
  assert.ok(c.logprobs.token_logprobs.every((x: number) => x <= 0));
  assert.deepEqual(a.json.usage, { prompt_tokens: 2, completion_tokens: 6, total_tokens: 8 });
  assert.equal(a.json.kv_transfer_params, null);
  assert.deepEqual(b.json.choices[0].token_ids, c.token_ids, 'seeded sampling is reproducible');
});

test('streaming: SSE chunks, the text equals the non-streamed text, usage chunk, [DONE] last', async () => {
  const body = { prompt: 'Stream me', max_tokens: 5, temperature: 0, ignore_eos: true };
  const whole = await post('/v1/completions', body);
  const s = await post('/v1/completions', { ...body, stream: true, stream_options: { include_usage: true } });
  assert.equal(s.status, 200);
  assert.match(s.headers.get('content-type') ?? '', /text\/event-stream/);
  const events = new SseParser().push(s.text);
  assert.equal(events.at(-1), '[DONE]');
  const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
  const usage = chunks.at(-1);
  assert.deepEqual(usage.choices, []);
  assert.equal(usage.usage.completion_tokens, 5);
  const text = chunks
    .slice(0, -1)
    .map((c) => c.choices[0].text)
    .join('');
  assert.equal(text, whole.json.choices[0].text);
  assert.equal(chunks.at(-2).choices[0].finish_reason, 'length');
});

test('chat through the openai client: JSON and stream agree, the assistant role comes first', async () => {
  const client = new OpenAI({ baseURL: `${inst.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  const req = {
    model: 'dsv4-mini',
    messages: [{ role: 'user' as const, content: 'Say something' }],
    max_tokens: 7,
    temperature: 0,
    seed: 1,
  };
  const full = await client.chat.completions.create(req);
  assert.equal(full.choices[0]?.message.role, 'assistant');
  let streamed = '';
  let roles = 0;
  for await (const ch of await client.chat.completions.create({ ...req, stream: true })) {
    streamed += ch.choices[0]?.delta.content ?? '';
    if (ch.choices[0]?.delta.role) roles++;
  }
  assert.equal(streamed, full.choices[0]?.message.content);
  assert.equal(roles, 1);
  const models = await client.models.list();
  assert.deepEqual(
    models.data.map((m) => m.id),
    ['dsv4-mini'],
  );
});

test('bad requests get 4xx OpenAI error JSON and the server keeps serving', async () => {
  const cases: Array<[unknown, number, string]> = [
    ['{not json', 400, 'BAD_REQUEST'],
    ['[1,2]', 400, 'BAD_REQUEST'],
    [{ prompt: 42 }, 400, 'BAD_REQUEST'],
    [{ prompt: 'x', max_tokens: 'ten' }, 400, 'BAD_REQUEST'],
    [{ prompt: 'x', max_tokens: 0 }, 400, 'BAD_REQUEST'],
    [{ prompt: 'x', max_tokens: 100_000 }, 400, 'BAD_REQUEST'],
    [{ prompt: 'x', n: 2 }, 400, 'BAD_REQUEST'],
    [{ prompt: 'x', temperature: -1 }, 400, 'BAD_REQUEST'],
    [{ prompt: 'x', logprobs: 3 }, 400, 'BAD_REQUEST'],
    [{ prompt: [1, 2, 99_999_999] }, 400, 'BAD_REQUEST'],
    [{ prompt: 'word '.repeat(600) }, 400, 'PROMPT_TOO_LONG'],
    [{ prompt: 'word '.repeat(300), max_tokens: 400 }, 400, 'PROMPT_TOO_LONG'],
    [{ prompt: 'x', model: 'gpt-4' }, 404, 'NOT_FOUND'],
    [{ prompt: 'x', kv_transfer_params: { remote_block_ids: [[-1]] } }, 400, 'BAD_TRANSFER_PARAMS'],
    [{ prompt: 'x', kv_transfer_params: { do_remote_prefill: true } }, 400, 'BAD_TRANSFER_PARAMS'],
  ];
  for (const [body, status, code] of cases) {
    const r = await post('/v1/completions', body);
    assert.equal(r.status, status, `${JSON.stringify(body).slice(0, 60)} → ${r.text}`);
    assert.equal(r.json.error.code, code);
    assert.equal(typeof r.json.error.message, 'string');
  }
  const chat = await post('/v1/chat/completions', { messages: [] });
  assert.equal(chat.status, 400);
  const notFound = await fetch(`${inst.url}/v2/nothing`);
  assert.equal(notFound.status, 404);
  const ok = await post('/v1/completions', { prompt: 'still alive?', max_tokens: 2 });
  assert.equal(ok.status, 200);
  await waitIdle(inst);
  assert.equal(inst.engine.kv.getNumFreeBlocks(), 159, 'refused requests allocated nothing');
});

test("errors name the offending field (param) in the client's terms; refused vLLM fields are named", async () => {
  const cases: Array<[string, unknown, number, string, string, RegExp]> = [
    [
      '/v1/completions',
      { prompt: 'x', max_tokens: 0 },
      400,
      'BAD_REQUEST',
      'max_tokens',
      /max_tokens must be at least 1, got 0/,
    ],
    ['/v1/completions', { prompt: 'x', model: 'gpt-4' }, 404, 'NOT_FOUND', 'model', /gpt-4/],
    [
      '/v1/completions',
      { prompt: 'x', min_p: 0.1 },
      400,
      'BAD_REQUEST',
      'min_p',
      /^min_p is not supported by this server/,
    ],
    [
      '/v1/completions',
      { prompt: 'x', repetition_penalty: 1.3 },
      400,
      'BAD_REQUEST',
      'repetition_penalty',
      /not supported/,
    ],
    [
      '/v1/completions',
      { prompt: Array(100_000).fill(11) },
      400,
      'PROMPT_TOO_LONG',
      'prompt',
      /100000 tokens; this model takes at most 511/,
    ],
    [
      '/v1/completions',
      { prompt: 'x', kv_transfer_params: { remote_block_ids: Array(100_000).fill(1) } },
      400,
      'BAD_TRANSFER_PARAMS',
      'kv_transfer_params.remote_block_ids',
      /100000 entries; at most 65536/,
    ],
    [
      '/v1/completions',
      { prompt: 'x', kv_transfer_params: { do_remote_prefill: true } },
      400,
      'BAD_TRANSFER_PARAMS',
      'kv_transfer_params.do_remote_prefill',
      /needs a decode instance/,
    ],
    ['/v1/chat/completions', { messages: [] }, 400, 'BAD_REQUEST', 'messages', /messages must not be empty/],
    [
      '/v1/chat/completions',
      { messages: [{ role: 'user', content: 'x' }], tools: [{ type: 'function' }] },
      400,
      'BAD_REQUEST',
      'tools',
      /tools is not supported/,
    ],
    [
      '/v1/chat/completions',
      { messages: [{ role: 'user', content: 'x' }], response_format: { type: 'json_object' } },
      400,
      'BAD_REQUEST',
      'response_format',
      /only \{"type": "text"\}/,
    ],
  ];
  for (const [path, body, status, code, param, message] of cases) {
    const r = await post(path, body);
    const what = JSON.stringify(body).slice(0, 60);
    assert.equal(r.status, status, `${what} → ${r.text.slice(0, 200)}`);
    assert.deepEqual(
      { code: r.json.error.code, param: r.json.error.param, type: r.json.error.type },
      { code, param, type: 'invalid_request_error' },
      what,
    );
    assert.match(r.json.error.message, message, what);
  }
  // Neutral values of the same fields, and OpenAI's bookkeeping fields, are accepted.
  const ok = await post('/v1/chat/completions', {
    messages: [{ role: 'user', content: 'hi' }],
    max_tokens: 2,
    min_p: 0,
    repetition_penalty: 1,
    min_tokens: 0,
    skip_special_tokens: true,
    tools: [],
    user: 'u',
    metadata: { a: 'b' },
    store: false,
  });
  assert.equal(ok.status, 200, ok.text);
});

test('include_stop_str_in_output: the text ends with the stop string, streamed or not', async () => {
  const base = { prompt: 'Once upon a time', max_tokens: 24, temperature: 0, ignore_eos: true };
  const free = (await post('/v1/completions', base)).json.choices[0].text as string;
  const stop = free.slice(6, 9);
  assert.ok(stop.trim().length > 0 && free.indexOf(stop) > 0, `a stop string from the text '${free}'`);
  for (const stream of [false, true]) {
    const r = await post('/v1/completions', { ...base, stop, include_stop_str_in_output: true, stream });
    const text = stream
      ? new SseParser()
          .push(r.text)
          .filter((e) => e !== '[DONE]')
          .map((e) => JSON.parse(e).choices[0]?.text ?? '')
          .join('')
      : r.json.choices[0].text;
    assert.equal(text, free.slice(0, free.indexOf(stop) + stop.length), `stream=${stream}`);
  }
});

test('API key: /v1/* needs the bearer key, /health does not', async () => {
  assert.equal((await post('/v1/completions', { prompt: 'x', max_tokens: 1 }, {}, keyed.url)).status, 401);
  assert.equal(
    (await post('/v1/completions', { prompt: 'x', max_tokens: 1 }, { authorization: 'Bearer wrong' }, keyed.url))
      .status,
    401,
  );
  assert.equal(
    (await post('/v1/completions', { prompt: 'x', max_tokens: 1 }, { authorization: 'Bearer sekrit' }, keyed.url))
      .status,
    200,
  );
  assert.equal((await fetch(`${keyed.url}/health`)).status, 200);
});

test('X-Request-Id is echoed and names the response; a malformed one is a 400', async () => {
  const r = await post('/v1/completions', { prompt: 'x', max_tokens: 1 }, { 'x-request-id': 'abc-123' });
  assert.equal(r.headers.get('x-request-id'), 'abc-123');
  assert.equal(r.json.id, 'cmpl-abc-123');
  const bad = await post('/v1/completions', { prompt: 'x', max_tokens: 1 }, { 'x-request-id': 'has space' });
  assert.equal(bad.status, 400);
  const gen = await post('/v1/completions', { prompt: 'x', max_tokens: 1 });
  assert.match(gen.headers.get('x-request-id') ?? '', /^[0-9a-f]{24}$/);
});

test('stop strings: the text ends right before the first stop string, finish_reason stop', async () => {
  const base = { prompt: 'Once upon a time', max_tokens: 24, temperature: 0, ignore_eos: true };
  const free = (await post('/v1/completions', base)).json.choices[0].text as string;
  const stop = free.slice(5, 8);
  assert.ok(stop.trim().length > 0, `a stop string from the text '${free}'`);
  for (const stream of [false, true]) {
    const r = await post('/v1/completions', { ...base, stop: [stop, 'zzzz-never'], stream });
    const text = stream
      ? new SseParser()
          .push(r.text)
          .filter((e) => e !== '[DONE]')
          .map((e) => JSON.parse(e).choices[0]?.text ?? '')
          .join('')
      : r.json.choices[0].text;
    assert.equal(text, free.slice(0, free.indexOf(stop)), `stream=${stream}`);
  }
  await waitIdle(inst);
  assert.equal(inst.engine.kv.getNumFreeBlocks(), 159);
});

test('a client that disconnects mid-stream aborts its request and its pages come back', async () => {
  const metricBefore = await abortCount();
  await new Promise<void>((resolve, reject) => {
    const timer = env.setTimer(10_000, () => reject(new Error('no first chunk')));
    const u = new URL(`${inst.url}/v1/completions`);
    const req = httpRequest(
      {
        host: u.hostname,
        port: u.port,
        path: u.pathname,
        method: 'POST',
        headers: { 'content-type': 'application/json' },
      },
      (res) => {
        res.once('data', () => {
          req.destroy(); // gone after the first token
          timer.cancel();
          resolve();
        });
      },
    );
    req.on('error', () => undefined);
    req.end(JSON.stringify({ prompt: 'never finish', max_tokens: 400, ignore_eos: true, stream: true }));
  });
  await waitIdle(inst);
  assert.equal(inst.engine.kv.getNumFreeBlocks(), 159);
  assert.equal((await abortCount()) - metricBefore, 1, 'the request ended as aborted, not by length');
});

test('POST /handoff/cancel aborts a running request in band (its client, still connected, gets REQUEST_ABORTED), or one that starts later; unknown ids and bad bodies', async () => {
  const running = post(
    '/v1/completions',
    { prompt: 'cancel me', max_tokens: 400, ignore_eos: true },
    { 'x-request-id': 'cancel-1' },
  );
  for (let k = 0; k < 400 && !inst.engine.scheduler.requests.has('cancel-1'); k++) await env.sleep(5);
  assert.deepEqual((await post('/handoff/cancel', { request_id: 'cancel-1' })).json, { cancelled: true });
  const r = await running;
  assert.equal(r.json?.error?.code, 'REQUEST_ABORTED', r.text);
  assert.deepEqual((await post('/handoff/cancel', { request_id: 'cancel-1' })).json, { cancelled: false });
  // A cancel that comes before its request (still being read or tokenized here) waits for it.
  assert.deepEqual((await post('/handoff/cancel', { request_id: 'cancel-2' })).json, { cancelled: false });
  const early = await post(
    '/v1/completions',
    { prompt: 'too late', max_tokens: 400, ignore_eos: true },
    { 'x-request-id': 'cancel-2' },
  );
  assert.equal(early.json?.error?.code, 'REQUEST_ABORTED', early.text);
  assert.equal((await post('/handoff/cancel', { request_id: 7 })).status, 400);
  assert.equal((await post('/handoff/cancel', 'not json')).status, 400);
  await waitIdle(inst);
  assert.equal(inst.engine.kv.getNumFreeBlocks(), 159);
});

async function abortCount(): Promise<number> {
  const text = await (await fetch(`${inst.url}/metrics`)).text();
  const m = /handoff_requests_total\{finish_reason="abort"[^}]*\} (\d+)/.exec(text);
  return m ? Number(m[1]) : 0;
}

test('/metrics: Prometheus text with the engine gauges, latency histograms and counters', async () => {
  await post('/v1/completions', { prompt: 'metrics', max_tokens: 3 });
  await waitIdle(inst);
  const r = await fetch(`${inst.url}/metrics`);
  assert.match(r.headers.get('content-type') ?? '', /text\/plain/);
  const text = await r.text();
  for (const name of [
    'handoff_num_requests_running',
    'handoff_kv_cache_usage_perc',
    'handoff_pages_zeroed_total',
    'handoff_time_to_first_token_seconds_bucket',
    'handoff_transfer_grants_refused_total',
  ]) {
    assert.match(text, new RegExp(`^${name}\\{`, 'm'), name);
  }
  assert.match(text, /^handoff_kv_free_pages\{role="both",model="dsv4-mini"\} 159$/m);
  const ttftCount = /^handoff_time_to_first_token_seconds_count\{[^}]*\} (\d+)$/m.exec(text);
  assert.ok(Number(ttftCount?.[1]) > 0);
  assert.equal((await fetch(`${inst.url}/health`)).status, 200);
});

test('--race-check: the page lifecycle oracle watches the real threaded engine; a violation is counted and logged, serving goes on', async () => {
  const errors: string[] = [];
  const log = {
    error: (_: unknown, msg: string) => errors.push(msg),
    warn: () => {},
    info: () => {},
    debug: () => {},
  } as unknown as Parameters<typeof startInstance>[2];
  const rc = await startInstance(
    {
      ...DEFAULT_INSTANCE_OPTIONS,
      port: 0,
      device: 'threaded',
      raceCheck: true,
      numBlocks: 160,
      scheduler: { maxModelLen: 512 },
    },
    env,
    log,
  );
  const violations = async (): Promise<number> =>
    Number(
      /^handoff_lifecycle_violations_total\{[^}]*\} (\d+)$/m.exec(await (await fetch(`${rc.url}/metrics`)).text())?.[1],
    );
  try {
    assert.equal(
      (await post('/v1/completions', { prompt: 'watched', max_tokens: 4, ignore_eos: true }, {}, rc.url)).status,
      200,
    );
    await waitIdle(rc);
    assert.equal(await violations(), 0, 'a normal completion breaks no invariant');
    // Drive the pool directly: copy out of a page after freeing it (a use after free).
    const pool = rc.engine.kv.blockPool;
    const [freed, dst] = pool.getNewBlocks(2);
    assert.ok(freed && dst);
    pool.freeBlocks([freed]);
    await rc.engine.device.compute.enqueue({
      op: { kind: 'copy', pairs: [[freed.blockId, dst.blockId]], slabs: [0] },
      label: { what: 'cow' },
    }).done;
    pool.freeBlocks([dst]);
    // I4 (the page is free) and, on this zeroing preset, I2 (nobody zeroed it): each counted and logged once.
    assert.ok(
      errors.some((m) =>
        new RegExp(`page lifecycle violation: .*block ${freed.blockId}: .*reads a freed page`).test(m),
      ),
      errors.join('\n'),
    );
    assert.equal(await violations(), errors.length);
    assert.equal((await post('/v1/completions', { prompt: 'still serving', max_tokens: 2 }, {}, rc.url)).status, 200);
  } finally {
    await rc.close();
  }
});

test('toHandoffError: an AssertionFailure in a request path is re-thrown (the bug crashes), other errors still map to INTERNAL', () => {
  const bug = new AssertionFailure('a page freed twice');
  assert.throws(
    () => toHandoffError(bug),
    (e: unknown) => e === bug,
  );
  const internal = toHandoffError(new TypeError('x is undefined'));
  assert.equal(internal.code, 'INTERNAL');
  assert.equal(internal.httpStatus, 500);
  assert.match(internal.message, /x is undefined/);
  const operating = new HandoffError('PEER_UNAVAILABLE', 'decode is gone');
  assert.equal(toHandoffError(operating), operating);
});

test('a cancel that comes after its request was answered does not cancel the next request reusing the id', async () => {
  // The in-process sim device answers within the request's own turn: the cancel comes once it is gone.
  const auth = { authorization: 'Bearer sekrit' };
  const ask = (prompt: string) =>
    post('/v1/completions', { prompt, max_tokens: 4 }, { ...auth, 'x-request-id': 'late-7' }, keyed.url);
  const first = await ask('hello');
  assert.equal(first.status, 200, first.text);
  // The proxy's in-band cancel raced the answer: nothing left to cancel, and nothing kept for later.
  const cancel = await post('/handoff/cancel', { request_id: 'late-7' }, auth, keyed.url);
  assert.deepEqual(cancel.json, { cancelled: false });
  const again = await ask('hello again');
  assert.equal(again.status, 200, `the retry was cancelled by the late cancel: ${again.text}`);
});
