/**
 * OpenAI API compatibility with vLLM (each test cites the vLLM behaviour it checks), over the scripted engine
 */
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { encode } from '../model/tokenizer.ts';
import { startFake, sse, EOS, type Fake } from './scripted_server_testkit.ts';

let f: Fake;
before(async () => {
  f = await startFake();
  f.script = [...encode('Hello world'), EOS];
});
after(async () => f.close());

async function post(path: string, body: unknown): Promise<{ status: number; json: any }> {
  const r = await fetch(f.url + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: r.status, json: await r.json() };
}

// vLLM: CompletionRequest/ChatCompletionRequest.validate_stream_options (completion/protocol.py,
// chat_completion/protocol.py): "Stream options can only be defined when `stream=True`." → 400.
test('stream_options without stream is refused (400, param stream_options), both endpoints', async () => {
  const c = await post('/v1/completions', { prompt: 'x', max_tokens: 2, stream_options: { include_usage: true } });
  assert.equal(c.status, 400, JSON.stringify(c.json));
  assert.equal(c.json.error.param, 'stream_options');
  const ch = await post('/v1/chat/completions', {
    messages: [{ role: 'user', content: 'x' }],
    max_tokens: 2,
    stream: false,
    stream_options: { include_usage: true },
  });
  assert.equal(ch.status, 400, JSON.stringify(ch.json));
  // An empty (falsy) stream_options stays accepted, as vLLM's `data.get("stream_options")` check does.
  const empty = await post('/v1/completions', { prompt: 'x', max_tokens: 2, stream_options: {} });
  assert.equal(empty.status, 200);
  const nul = await post('/v1/completions', { prompt: 'x', max_tokens: 2, stream_options: null });
  assert.equal(nul.status, 200);
});

// vLLM: serving_completion.py _create_completion_logprobs appends, per token, a dict of the top
// `logprobs + 1` entries (`if num_output_top_logprobs >= i`): with logprobs 0, {sampled token: logprob}.
test('completions logprobs: 0 gives top_logprobs as one {token: logprob} per token (streamed and not)', async () => {
  const body = { prompt: 'x', max_tokens: 2, logprobs: 0 };
  const r = await post('/v1/completions', body);
  assert.equal(r.status, 200);
  const lp = r.json.choices[0].logprobs;
  assert.deepEqual(lp.tokens, ['Hello', ' world']);
  assert.deepEqual(lp.top_logprobs, [{ Hello: -0.5 }, { ' world': -0.5 }]);
  const chunks = (await sse(f.url, '/v1/completions', { ...body, stream: true }))
    .filter((d) => d !== '[DONE]')
    .map((d) => JSON.parse(d));
  const streamed = chunks.flatMap((c) => c.choices[0].logprobs.top_logprobs);
  assert.deepEqual(streamed, [{ Hello: -0.5 }, { ' world': -0.5 }]);
});

// vLLM: OpenAIServing._is_model_supported (entrypoints/openai/serving_engine.py): `if not model_name:
// return True`, so an empty model name is served by the base model like an absent one.
test('model "" is served like an absent model (not a 404)', async () => {
  const r = await post('/v1/completions', { model: '', prompt: 'x', max_tokens: 2 });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  assert.equal(r.json.model, 'dsv4-mini');
});

// vLLM: CompletionResponseChoice / CompletionResponseStreamChoice (completion/protocol.py) and
// ChatCompletionResponseChoice / ChatCompletionResponseStreamChoice (chat_completion/protocol.py) carry
// `stop_reason`: the stop string or stop token id that ended the answer, null for EOS or length.
test('stop_reason: the stop string, the stop token id, or null (EOS, length), streamed and not', async () => {
  const world = encode(' world')[0]!;
  const cases: Array<[Record<string, unknown>, unknown, string]> = [
    [{ stop: ['wor', 'zz'] }, 'wor', 'stop'],
    [{ stop_token_ids: [world] }, world, 'stop'],
    [{}, null, 'stop'], // EOS
    [{ max_tokens: 1 }, null, 'length'],
  ];
  for (const [extra, reason, finish] of cases) {
    const body = { prompt: 'x', max_tokens: 5, ...extra };
    const r = await post('/v1/completions', body);
    assert.equal(r.json.choices[0].finish_reason, finish);
    assert.deepEqual(r.json.choices[0].stop_reason, reason, JSON.stringify(extra));
    const chat = await post('/v1/chat/completions', {
      ...body,
      prompt: undefined,
      messages: [{ role: 'user', content: 'x' }],
    });
    assert.deepEqual(chat.json.choices[0].stop_reason, reason, `chat ${JSON.stringify(extra)}`);
    const last = (await sse(f.url, '/v1/completions', { ...body, stream: true }))
      .filter((d) => d !== '[DONE]')
      .map((d) => JSON.parse(d))
      .at(-1);
    assert.equal(last.choices[0].finish_reason, finish);
    assert.deepEqual(last.choices[0].stop_reason, reason, `stream ${JSON.stringify(extra)}`);
  }
});
