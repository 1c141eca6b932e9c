/**
 * End to end with real processes on loopback: `handoff serve --role prefill`, `--role decode` (READ,
 * tcp transport), `handoff proxy`, and a colocated `--role both`, driven by the `openai` client.
 * Proves: through the proxy, completions, chat and streaming give the colocated server's tokens for the
 * same prompt and seed (greedy and seeded sampling); /metrics parses and free pages return to their
 * start value; bad requests get 4xx JSON and the servers keep serving; and a vLLM-style proxy flow done
 * by hand (prefill max_tokens 1 + do_remote_decode, then decode with the returned params) works unchanged.
 * Prefill pages by 8 tokens, decode by 32 and the colocated server by 16 (issue 14): every comparison
 * below also proves the mapping between block sizes, clipped tails included, over real sockets.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { RealEnv } from '../../src/util/env.ts';
import { spawnHandoff, type ChildServer } from '../../src/cli/children.ts';
import { serveArgs } from '../../src/cli/cluster.ts';
import { scatterNative } from '../../src/transfer/tcp/scatter_native.ts';

const env = new RealEnv(5);
const NUM_BLOCKS = 256;
const common = {
  preset: 'dsv4-mini' as const,
  mode: 'read' as const,
  host: '127.0.0.1',
  serveArgs: ['--num-blocks', String(NUM_BLOCKS), '--max-model-len', '512'],
  roleServeArgs: { prefill: ['--block-size', '8'], decode: ['--block-size', '32'] },
};
let prefill: ChildServer;
let decode: ChildServer;
let colocated: ChildServer;
let proxy: ChildServer;
const children: ChildServer[] = [];

before(async () => {
  const started = await Promise.allSettled([
    spawnHandoff(serveArgs('prefill', common), env),
    spawnHandoff(serveArgs('decode', common), env),
    spawnHandoff(serveArgs('both', common), env),
  ]);
  for (const s of started) if (s.status === 'fulfilled') children.push(s.value);
  const failed = started.find((s) => s.status === 'rejected');
  if (failed) throw failed.reason;
  [prefill, decode, colocated] = children as [ChildServer, ChildServer, ChildServer];
  proxy = await spawnHandoff(['proxy', '--prefill', prefill.url, '--decode', decode.url, '--port', '0'], env);
  children.push(proxy);
});

after(async () => {
  await Promise.all(children.map((c) => c.stop()));
  for (const c of children) assert.ok(c.exited, `pid ${c.pid} exited`);
});

const client = (url: string): OpenAI =>
  new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 30_000 });
const tokenIds = (r: unknown): number[] => (r as { choices: Array<{ token_ids: number[] }> }).choices[0]!.token_ids;

test('completions through the P/D proxy equal colocated, token for token (greedy and seeded sampling)', async () => {
  const prompts = ['Disaggregated serving moves the KV cache from prefill to decode, so', 'short'];
  for (const prompt of prompts) {
    for (const sampling of [{ temperature: 0 }, { temperature: 0.9, seed: 77 }]) {
      // ignore_eos and return_token_ids are vLLM extensions the client passes through.
      const body = {
        model: 'dsv4-mini',
        prompt,
        max_tokens: 16,
        ignore_eos: true,
        return_token_ids: true,
        ...sampling,
      } as unknown as OpenAI.CompletionCreateParamsNonStreaming;
      const [pd, ref] = await Promise.all([
        client(proxy.url).completions.create(body),
        client(colocated.url).completions.create(body),
      ]);
      assert.equal(tokenIds(pd).length, 16);
      assert.deepEqual(tokenIds(pd), tokenIds(ref), `${prompt.slice(0, 16)} ${JSON.stringify(sampling)}`);
      assert.equal(pd.choices[0]?.text, ref.choices[0]?.text);
      assert.deepEqual(pd.usage, ref.usage);
    }
  }
});

test('chat and streaming through the proxy: streamed text equals colocated, usage chunk last', async () => {
  const messages = [{ role: 'user' as const, content: 'Tell me about pages and grants.' }];
  const ref = await client(colocated.url).chat.completions.create({
    model: 'dsv4-mini',
    messages,
    max_tokens: 12,
    temperature: 0,
  });
  let text = '';
  let usage: OpenAI.CompletionUsage | null | undefined = null;
  const stream = await client(proxy.url).chat.completions.create({
    model: 'dsv4-mini',
    messages,
    max_tokens: 12,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  for await (const ch of stream) {
    text += ch.choices[0]?.delta.content ?? '';
    if (ch.usage) usage = ch.usage;
  }
  assert.equal(text, ref.choices[0]?.message.content);
  assert.equal(usage?.completion_tokens, 12);
  let completion = '';
  for await (const ch of await client(proxy.url).completions.create({
    model: 'dsv4-mini',
    prompt: 'Stream',
    max_tokens: 8,
    temperature: 0,
    stream: true,
  }))
    completion += ch.choices[0]?.text ?? '';
  const refCompletion = await client(colocated.url).completions.create({
    model: 'dsv4-mini',
    prompt: 'Stream',
    max_tokens: 8,
    temperature: 0,
  });
  assert.equal(completion, refCompletion.choices[0]?.text);
});

test('a vLLM-style proxy flow by hand: prefill (max_tokens 1, do_remote_decode) then decode with the returned params', async () => {
  const body = {
    model: 'dsv4-mini',
    prompt: 'By hand, like vLLM toy_proxy_server does it.',
    max_tokens: 10,
    temperature: 0,
    ignore_eos: true,
    return_token_ids: true,
  };
  const pre = await fetch(`${prefill.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': 'by-hand-1' },
    body: JSON.stringify({
      ...body,
      stream: false,
      max_tokens: 1,
      kv_transfer_params: {
        do_remote_decode: true,
        do_remote_prefill: false,
        remote_engine_id: null,
        remote_block_ids: null,
        remote_host: null,
        remote_port: null,
      },
    }),
  });
  assert.equal(pre.status, 200);
  const params = ((await pre.json()) as { kv_transfer_params: Record<string, unknown> }).kv_transfer_params;
  for (const k of ['remote_engine_id', 'remote_block_ids', 'remote_host', 'remote_port', 'transfer_id', 'grant'])
    assert.ok(params[k] !== undefined && params[k] !== null, k);
  assert.equal(params['do_remote_prefill'], true);
  assert.equal(params['remote_block_size'], 8, 'prefill names its block size; decode pages by 32');
  const dec = await fetch(`${decode.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': 'by-hand-1' },
    body: JSON.stringify({ ...body, kv_transfer_params: params }),
  });
  assert.equal(dec.status, 200);
  assert.equal(dec.headers.get('x-request-id'), 'by-hand-1');
  const ref = await client(colocated.url).completions.create(body as OpenAI.CompletionCreateParamsNonStreaming);
  assert.deepEqual(tokenIds(await dec.json()), tokenIds(ref));
});

test('bad requests: 4xx OpenAI error JSON, directly and through the proxy, and everyone keeps serving', async () => {
  const cases: Array<[string, string, number]> = [
    ['{oops', 'BAD_REQUEST', 400],
    [JSON.stringify({ prompt: 'x', max_tokens: 'many' }), 'BAD_REQUEST', 400],
    [JSON.stringify({ prompt: 'word '.repeat(600) }), 'PROMPT_TOO_LONG', 400],
    [JSON.stringify({ prompt: 'x', max_tokens: 5000 }), 'BAD_REQUEST', 400],
    [
      JSON.stringify({ prompt: 'x', kv_transfer_params: { do_remote_prefill: true, remote_block_ids: [[0, 0]] } }),
      'BAD_TRANSFER_PARAMS',
      400,
    ],
  ];
  for (const url of [decode.url, proxy.url]) {
    for (const [body, code, status] of cases) {
      const r = await fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body,
      });
      const j = (await r.json()) as { error: { code: string; message: string; type: string } };
      if (url === proxy.url && code === 'BAD_TRANSFER_PARAMS') continue; // the proxy sets its own params
      assert.equal(r.status, status, `${url} ${body.slice(0, 40)}: ${j.error.message}`);
      assert.equal(j.error.code, code);
      assert.equal(j.error.type, 'invalid_request_error');
    }
  }
  const ok = await client(proxy.url).completions.create({ model: 'dsv4-mini', prompt: 'still serving', max_tokens: 3 });
  assert.equal(ok.choices[0]?.finish_reason === 'length' || ok.choices[0]?.finish_reason === 'stop', true);
});

/** Parse Prometheus text: every sample line is `name{labels} value`. */
function parseMetrics(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.e+-]+|NaN|\+Inf|-Inf)$/.exec(line);
    assert.ok(m, `a Prometheus sample line: '${line}'`);
    out.set(`${m[1]}${m[2] ?? ''}`, Number(m[3]));
  }
  return out;
}

const metric = (m: Map<string, number>, name: string): number =>
  [...m].find(([k]) => k.startsWith(`${name}{`))?.[1] ?? NaN;

test('/metrics parses; transfers counted; free pages return to the start value on both sides', async () => {
  const pages = NUM_BLOCKS - 1;
  for (let k = 0; k < 800; k++) {
    const [p, d] = await Promise.all(
      [prefill, decode].map(async (c) => parseMetrics(await (await fetch(`${c.url}/metrics`)).text())),
    );
    if (metric(p!, 'handoff_kv_free_pages') === pages && metric(d!, 'handoff_kv_free_pages') === pages) {
      assert.ok(metric(d!, 'handoff_transfer_bytes_read_total') > 0, 'decode pulled bytes');
      assert.ok(metric(d!, 'handoff_transfer_reads_total') > 0);
      // The decode server's NIC read the READ replies straight into its pages (readv), unless the addon is off.
      if (scatterNative() !== null) assert.ok(metric(d!, 'handoff_transfer_scatter_reads_total') > 0, 'scatter reads');
      else assert.equal(metric(d!, 'handoff_transfer_scatter_reads_total'), 0);
      assert.ok(metric(d!, 'handoff_kv_read_seconds_count') > 0, 'READ latency observed');
      assert.equal(metric(p!, 'handoff_transfer_grants_refused_total'), 0);
      assert.equal(metric(d!, 'handoff_kv_load_failures_total'), 0, 'every READ loaded across block sizes');
      assert.ok(metric(d!, 'handoff_pages_tail_zeroed_total') > 0, 'decode pages of 32 got their clipped tails zeroed');
      assert.ok(
        metric(d!, 'handoff_pages_excluded_from_zeroing_total') > 0,
        'READ destinations left off the zeroing list (dsv4-mini)',
      );
      assert.ok(metric(d!, 'handoff_time_to_first_token_seconds_count') > 0);
      assert.equal(metric(d!, 'handoff_num_requests_running'), 0);
      return;
    }
    await env.sleep(25);
  }
  assert.fail('free pages did not return to the start value');
});
