/**
 * Bad and hostile input against real `handoff serve` processes on loopback (issue 8). Proves: malformed
 * JSON, wrong types, prompts over the model's length and max_tokens out of range get a 4xx OpenAI error
 * JSON with a stable code (also through the proxy); hostile kv_transfer_params on decode (negative,
 * duplicate, null or out-of-range block ids, more blocks than the prompt needs, wrong number of groups,
 * an unknown engine, a forged or swapped grant, pages that were not granted) each get a 4xx
 * with a stable code and READ nothing (an expired grant READs nothing either, and is recomputed: the lease
 * ended, no fault of the client's); refusals by prefill's NIC are counted in its /metrics; a request
 * refused before any READ leaves the real transfer intact (its rightful use still gives the colocated
 * tokens); no page leaks on either side, and every server keeps serving. One long word (issue 11):
 * a 1 MB single-word prompt is refused by its length at once, one just under the bound is tokenized
 * off the event loop, and /health keeps answering all along, on decode, prefill and the proxy.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { RealEnv } from '../../src/util/env.ts';
import { spawnHandoff, type ChildServer } from '../../src/cli/children.ts';
import { allPagesFree as allFree, metric, tokens, waitFor as waitWithin, type Reply } from './kit.ts';

const env = new RealEnv(10);
const NUM_BLOCKS = 192;
const TOTAL_PAGES = NUM_BLOCKS - 1;
const MAX_MODEL_LEN = 512;
const children: ChildServer[] = [];
const waitFor = (what: string, cond: () => Promise<boolean>, boundMs?: number): Promise<void> =>
  waitWithin(env, what, cond, boundMs);
const allPagesFree = (c: ChildServer): Promise<void> => allFree(env, c, TOTAL_PAGES);
let prefill: ChildServer;
/** A prefill whose grants and leases end after 200 ms (the expired-grant case). */
let shortLease: ChildServer;
let decode: ChildServer;
let proxy: ChildServer;

async function serve(role: 'prefill' | 'decode', extra: Record<string, unknown> = {}): Promise<ChildServer> {
  const config = JSON.stringify({
    kv_connector: 'OneSidedConnector',
    kv_connector_extra_config: { read_mode: true, ...extra },
  });
  const args = [
    'serve',
    '--role',
    role,
    '--model',
    'dsv4-mini',
    '--host',
    '127.0.0.1',
    '--port',
    '0',
    '--num-blocks',
    String(NUM_BLOCKS),
    '--max-model-len',
    String(MAX_MODEL_LEN),
    '--kv-transfer-config',
    config,
  ];
  return spawnHandoff(args, env, { env: { HANDOFF_LOG_LEVEL: 'error' } });
}

before(async () => {
  // lease_ms 5000: a hostile request cannot release the transfer it names (a release must carry that
  // transfer's grant token), so those pages come back when the lease ends.
  const started = await Promise.allSettled([
    serve('prefill', { lease_ms: 5000 }),
    serve('prefill', { lease_ms: 200 }),
    serve('decode'),
  ]);
  for (const s of started) if (s.status === 'fulfilled') children.push(s.value);
  const failed = started.find((s) => s.status === 'rejected');
  if (failed) throw failed.reason;
  [prefill, shortLease, decode] = children as [ChildServer, ChildServer, ChildServer];
  proxy = await spawnHandoff(['proxy', '--prefill', prefill.url, '--decode', decode.url, '--port', '0'], env, {
    env: { HANDOFF_LOG_LEVEL: 'error' },
  });
  children.push(proxy);
});

after(async () => {
  await Promise.all(children.map((c) => c.stop(2000)));
  for (const c of children) assert.ok(c.exited, `pid ${c.pid} exited`);
});

async function postRaw(
  url: string,
  path: string,
  body: string | Uint8Array,
  headers: Record<string, string> = {},
): Promise<Reply> {
  const r = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body,
    signal: AbortSignal.timeout(45_000),
  });
  return { status: r.status, json: (await r.json()) as Reply['json'] };
}

const post = (url: string, body: unknown, path = '/v1/completions'): Promise<Reply> =>
  postRaw(url, path, JSON.stringify(body));

/** An OpenAI-style error JSON with this status and code. */
function assertError(r: Reply, status: number, code: string, what: string): void {
  assert.equal(r.status, status, `${what}: ${JSON.stringify(r.json).slice(0, 300)}`);
  assert.equal(r.json.error?.code, code, what);
  assert.equal(r.json.error?.type, 'invalid_request_error', what);
  assert.ok(typeof r.json.error?.message === 'string' && r.json.error.message.length > 0, what);
  assert.ok('param' in (r.json.error ?? {}), `${what}: OpenAI error shape`);
}

// 55 tokens: four 16-token pages per transfer group (dsv4-mini has two groups), no fewer, no more.
const PROMPT =
  'Hostile parameters must be refused with a clear error, and nothing may leak from the pool of pages, ever. A grant names the pages, the peer and the transfer; a READ outside of it moves nothing at all, and is counted by the producer that refused it.';
const VICTIM_PROMPT = `${PROMPT} Someone else's prompt.`;
const BODY = {
  model: 'dsv4-mini',
  prompt: PROMPT,
  max_tokens: 6,
  temperature: 0,
  ignore_eos: true,
  return_token_ids: true,
};
type Params = Record<string, unknown> & { remote_block_ids: number[][] };

/** Valid page ids of the prefill pool that are not in `p`'s grant. */
const notGranted = (p: Params, n: number): number[] => {
  const granted = new Set(p.remote_block_ids.flat());
  return Array.from({ length: TOTAL_PAGES }, (_, i) => TOTAL_PAGES - i)
    .filter((b) => !granted.has(b))
    .slice(0, n);
};

async function params(from: ChildServer = prefill, prompt = PROMPT): Promise<Params> {
  const r = await post(from.url, { ...BODY, prompt, max_tokens: 1, kv_transfer_params: { do_remote_decode: true } });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  return r.json['kv_transfer_params'] as Params;
}

test('HTTP: malformed JSON, wrong types, over-long prompts, max_tokens out of range: 4xx OpenAI error JSON on decode, prefill and the proxy', async () => {
  const long = 'word '.repeat(600);
  const cases: Array<[string, string, string, number, string]> = [
    ['malformed JSON', '/v1/completions', '{"prompt": "x",', 400, 'BAD_REQUEST'],
    ['empty body', '/v1/completions', '', 400, 'BAD_REQUEST'],
    ['body is an array', '/v1/completions', '[1, 2]', 400, 'BAD_REQUEST'],
    ['body is null', '/v1/completions', 'null', 400, 'BAD_REQUEST'],
    ['no prompt', '/v1/completions', '{}', 400, 'BAD_REQUEST'],
    ['prompt is a number', '/v1/completions', '{"prompt": 5}', 400, 'BAD_REQUEST'],
    ['empty prompt', '/v1/completions', '{"prompt": ""}', 400, 'BAD_REQUEST'],
    ['token id over the vocabulary', '/v1/completions', '{"prompt": [99999999]}', 400, 'BAD_REQUEST'],
    ['negative token id', '/v1/completions', '{"prompt": [-1, 5]}', 400, 'BAD_REQUEST'],
    ['max_tokens is a string', '/v1/completions', '{"prompt": "x", "max_tokens": "many"}', 400, 'BAD_REQUEST'],
    ['max_tokens 0', '/v1/completions', '{"prompt": "x", "max_tokens": 0}', 400, 'BAD_REQUEST'],
    ['max_tokens negative', '/v1/completions', '{"prompt": "x", "max_tokens": -5}', 400, 'BAD_REQUEST'],
    ['max_tokens fractional', '/v1/completions', '{"prompt": "x", "max_tokens": 1.5}', 400, 'BAD_REQUEST'],
    [
      'max_tokens over max_model_len',
      '/v1/completions',
      JSON.stringify({ prompt: 'x', max_tokens: MAX_MODEL_LEN + 1 }),
      400,
      'BAD_REQUEST',
    ],
    ['temperature is a string', '/v1/completions', '{"prompt": "x", "temperature": "hot"}', 400, 'BAD_REQUEST'],
    ['temperature out of range', '/v1/completions', '{"prompt": "x", "temperature": 3}', 400, 'BAD_REQUEST'],
    ['n = 2', '/v1/completions', '{"prompt": "x", "n": 2}', 400, 'BAD_REQUEST'],
    ['stream is a string', '/v1/completions', '{"prompt": "x", "stream": "yes"}', 400, 'BAD_REQUEST'],
    ['prompt over max_model_len (text)', '/v1/completions', JSON.stringify({ prompt: long }), 400, 'PROMPT_TOO_LONG'],
    [
      'prompt over max_model_len (token ids)',
      '/v1/completions',
      JSON.stringify({ prompt: Array(MAX_MODEL_LEN).fill(11) }),
      400,
      'PROMPT_TOO_LONG',
    ],
    [
      'prompt + max_tokens over max_model_len',
      '/v1/completions',
      JSON.stringify({ prompt: Array(500).fill(11), max_tokens: 100 }),
      400,
      'PROMPT_TOO_LONG',
    ],
    ['chat: messages is a string', '/v1/chat/completions', '{"messages": "hi"}', 400, 'BAD_REQUEST'],
    ['chat: no messages', '/v1/chat/completions', '{"messages": []}', 400, 'BAD_REQUEST'],
    [
      'chat: unknown role',
      '/v1/chat/completions',
      '{"messages": [{"role": "wizard", "content": "hi"}]}',
      400,
      'BAD_REQUEST',
    ],
    ['unknown model', '/v1/completions', '{"prompt": "x", "model": "gpt-9"}', 404, 'NOT_FOUND'],
    ['unknown route', '/v1/embeddings', '{"input": "x"}', 404, 'NOT_FOUND'],
    [
      'kv_transfer_params is a string',
      '/v1/completions',
      '{"prompt": "x", "kv_transfer_params": "yes"}',
      400,
      'BAD_TRANSFER_PARAMS',
    ],
  ];
  for (const server of [decode, prefill, proxy]) {
    for (const [what, path, body, status, code] of cases) {
      // The proxy sets its own kv_transfer_params and has no /v1/embeddings of its own.
      if (server === proxy && (code === 'BAD_TRANSFER_PARAMS' || path === '/v1/embeddings')) continue;
      assertError(
        await postRaw(server.url, path, body),
        status,
        code,
        `${String(server.ready['role'] ?? 'proxy')} ${what}`,
      );
    }
  }
  // Bytes that are not UTF-8 inside a JSON string: refused, not decoded to replacement characters.
  const notUtf8 = Buffer.concat([Buffer.from('{"prompt": "a'), Buffer.from([0xff, 0xfe]), Buffer.from('b"}')]);
  for (const server of [decode, prefill, proxy])
    assertError(await postRaw(server.url, '/v1/completions', notUtf8), 400, 'BAD_REQUEST', 'a body that is not UTF-8');
  // A body over the 4 MiB limit: a 400 (or the server hangs up while we still send), and the connection
  // is closed, so the next request on this keep-alive client is not stuck behind the unread rest.
  const big = await postRaw(decode.url, '/v1/completions', JSON.stringify({ prompt: 'x'.repeat(5 << 20) })).catch(
    (e: unknown) => (e instanceof Error ? e : new Error(String(e))),
  );
  if (!(big instanceof Error)) assertError(big, 400, 'BAD_REQUEST', 'a 5 MiB body');
  // The P/D halves sent to the wrong role.
  assertError(
    await post(prefill.url, { ...BODY, kv_transfer_params: { do_remote_prefill: true } }),
    400,
    'BAD_TRANSFER_PARAMS',
    'do_remote_prefill on prefill',
  );
  assertError(
    await post(decode.url, { ...BODY, kv_transfer_params: { do_remote_decode: true } }),
    400,
    'BAD_TRANSFER_PARAMS',
    'do_remote_decode on decode',
  );
  assert.ok((await metric(decode, 'handoff_http_errors_total')) >= cases.length, 'errors counted by code');
  // Everyone keeps serving, and P/D through the proxy still equals colocated.
  assert.deepEqual(tokens(await post(proxy.url, BODY)), tokens(await post(decode.url, BODY)));
  assert.equal(tokens(await post(prefill.url, BODY)).length, 6);
});

/** GET /health over and over until `done` resolves; every answer within `hangMs`; the latencies. */
async function healthWhile(url: string, done: Promise<unknown>, hangMs: number): Promise<number[]> {
  let finished = false;
  void done.finally(() => (finished = true)).catch(() => undefined);
  const latencies: number[] = [];
  while (!finished || latencies.length < 3) {
    const t0 = env.nowMs();
    const r = await fetch(`${url}/health`, { signal: AbortSignal.timeout(hangMs) }).catch((e: unknown) =>
      assert.fail(`/health of ${url} did not answer within ${hangMs} ms: ${String(e)}`),
    );
    assert.equal(r.status, 200);
    await r.arrayBuffer();
    latencies.push(env.nowMs() - t0);
    await env.sleep(5);
  }
  return latencies;
}

test('one long word: 1 MB is refused by its length at once, a word just under the bound is tokenized off the event loop; /health answers throughout', async () => {
  // No GPT-2 token is longer than 128 bytes: more characters than (max_model_len - 1) × 128 cannot fit.
  const bound = (MAX_MODEL_LEN - 1) * 128;
  const cases: Array<[string, unknown, string, number, string]> = [
    ['1 MB word', { prompt: 'a'.repeat(1 << 20), max_tokens: 4 }, '/v1/completions', 2000, 'prompt'],
    [
      '1 MB word in chat',
      { messages: [{ role: 'user', content: 'b'.repeat(1 << 20) }], max_tokens: 4 },
      '/v1/chat/completions',
      2000,
      'messages',
    ],
    // Tokenized (on a tokenizer thread: its start is included, hence the longer bound), then too many tokens.
    ['a word just under the bound', { prompt: 'a'.repeat(bound), max_tokens: 4 }, '/v1/completions', 15_000, 'prompt'],
  ];
  for (const server of [decode, prefill, proxy]) {
    const name = String(server.ready['role'] ?? 'proxy');
    for (const [what, body, path, hangMs, param] of cases) {
      const t0 = env.nowMs();
      const answer = fetch(`${server.url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(hangMs),
      });
      const health = await healthWhile(server.url, answer, 2000);
      const r = await answer.catch((e: unknown) =>
        assert.fail(`${name} ${what}: no answer within ${hangMs} ms (${String(e)})`),
      );
      const ms = env.nowMs() - t0;
      const reply: Reply = { status: r.status, json: (await r.json()) as Reply['json'] };
      assertError(reply, 400, 'PROMPT_TOO_LONG', `${name} ${what}`);
      assert.equal((reply.json.error as { param?: unknown }).param, param, `${name} ${what}`);
      const sorted = [...health].sort((a, b) => a - b);
      console.log(
        `# ${name}, ${what}: answered in ${ms.toFixed(0)} ms (${reply.json.error?.message.slice(0, 70)}); /health × ${health.length}: p50 ${sorted[sorted.length >> 1]?.toFixed(1)} ms, max ${sorted.at(-1)?.toFixed(1)} ms`,
      );
    }
  }
  // Everyone keeps serving.
  assert.deepEqual(tokens(await post(proxy.url, BODY)), tokens(await post(decode.url, BODY)));
});

test('a duplicate X-Request-Id of a live request is a 400; the live request is unharmed', async () => {
  const slow = { ...BODY, max_tokens: 300 };
  const headers = { 'x-request-id': 'dup-1' };
  const first = postRaw(decode.url, '/v1/completions', JSON.stringify(slow), headers);
  await waitFor('the first request runs', async () => (await metric(decode, 'handoff_num_requests_running')) === 1);
  assertError(
    await postRaw(decode.url, '/v1/completions', JSON.stringify(BODY), headers),
    400,
    'BAD_REQUEST',
    'duplicate request id',
  );
  assert.equal(tokens(await first).length, 300);
});

test('hostile kv_transfer_params refused before admission: 400 BAD_TRANSFER_PARAMS, nothing read; a refusal that still names the transfer with its grant releases it, one that cannot does not touch it', async () => {
  const bytesRead = await metric(decode, 'handoff_transfer_bytes_read_total');
  const refused = await metric(prefill, 'handoff_transfer_grants_refused_total');
  const failures = await metric(decode, 'handoff_kv_load_failures_total');
  const ref = tokens(await post(decode.url, BODY));
  const g0 = (p: Params): number[] => p.remote_block_ids[0]!;
  const g1 = (p: Params): number[] => p.remote_block_ids[1]!;
  // 'kept': the refusal cannot name the transfer with its grant (malformed JSON-level values, or the
  // engine/transfer id/grant missing), so the real params still load. Otherwise decode releases the
  // transfer it was handed (the release carries the real grant): prefill frees the pages at once, and a
  // retry with those params is refused with GRANT_DENIED.
  const KEPT = new Set([
    'negative block id',
    'fractional block id',
    'block id is a string',
    'grant is not hex',
    'no grant',
    'no transfer id',
    'no remote engine',
    'remote_port out of range',
  ]);
  const mutations: Array<[string, (p: Params) => Record<string, unknown>]> = [
    ['negative block id', (p) => ({ ...p, remote_block_ids: [[-1, ...g0(p).slice(1)], g1(p)] })],
    ['fractional block id', (p) => ({ ...p, remote_block_ids: [[1.5, ...g0(p).slice(1)], g1(p)] })],
    ['block id is a string', (p) => ({ ...p, remote_block_ids: [['1', ...g0(p).slice(1)], g1(p)] })],
    ['the null block 0', (p) => ({ ...p, remote_block_ids: [[0, ...g0(p).slice(1)], g1(p)] })],
    ['duplicate block ids', (p) => ({ ...p, remote_block_ids: [[g0(p)[0]!, ...g0(p).slice(0, -1)], g1(p)] })],
    ['the same page in two groups', (p) => ({ ...p, remote_block_ids: [g0(p), [g0(p)[0]!, ...g1(p).slice(1)]] })],
    [
      'more blocks than the prompt needs',
      (p) => ({ ...p, remote_block_ids: [[...g0(p), ...notGranted(p, 1)], g1(p)] }),
    ],
    ['fewer blocks than the prompt needs', (p) => ({ ...p, remote_block_ids: [g0(p).slice(1), g1(p)] })],
    ['one group (a flat list)', (p) => ({ ...p, remote_block_ids: g0(p) })],
    ['three groups', (p) => ({ ...p, remote_block_ids: [g0(p), g1(p), notGranted(p, 4)] })],
    ['no groups', (p) => ({ ...p, remote_block_ids: [] })],
    ['grant is not hex', (p) => ({ ...p, grant: 'not-a-grant' })],
    ['no grant', (p) => ({ ...p, grant: null })],
    ['no transfer id', (p) => ({ ...p, transfer_id: null })],
    ['no remote engine', (p) => ({ ...p, remote_engine_id: null })],
    ['remote_port out of range', (p) => ({ ...p, remote_port: 70000 })],
    ['remote_num_tokens short of the prompt', (p) => ({ ...p, remote_num_tokens: 3 })],
  ];
  let refusedByPrefill = 0;
  for (const [what, mutate] of mutations) {
    const p = await params();
    assertError(await post(decode.url, { ...BODY, kv_transfer_params: mutate(p) }), 400, 'BAD_TRANSFER_PARAMS', what);
    if (KEPT.has(what)) {
      assert.deepEqual(
        tokens(await post(decode.url, { ...BODY, kv_transfer_params: p })),
        ref,
        `${what}: the real params still work`,
      );
    } else {
      await allPagesFree(prefill); // released now, not at the end of the lease
      assertError(
        await post(decode.url, { ...BODY, kv_transfer_params: p }),
        403,
        'GRANT_DENIED',
        `${what}: the released transfer`,
      );
      refusedByPrefill++;
    }
  }
  assert.equal(
    await metric(prefill, 'handoff_transfer_grants_refused_total'),
    refused + refusedByPrefill,
    'prefill refused only the retries of released transfers',
  );
  assert.equal(
    await metric(decode, 'handoff_kv_load_failures_total'),
    failures + refusedByPrefill,
    'every other rightful READ loaded',
  );
  assert.ok((await metric(decode, 'handoff_transfer_bytes_read_total')) > bytesRead, 'the rightful READs moved bytes');
  await Promise.all([allPagesFree(decode), allPagesFree(prefill)]);
});

test('hostile params refused at the READ: unknown engine, pages beyond the pool (400); forged, swapped grants and pages not granted (403 GRANT_DENIED); an expired grant recomputed; nothing read, refusals counted, no leak', async () => {
  const bytesRead = await metric(decode, 'handoff_transfer_bytes_read_total');
  const refused = await metric(prefill, 'handoff_transfer_grants_refused_total');
  // Another request's pages on the same prefill: real, valid-looking ids that are not in this grant.
  const victim = await params(prefill, VICTIM_PROMPT);
  const cases: Array<[string, (p: Params) => Record<string, unknown>, number, string]> = [
    ['unknown engine', (p) => ({ ...p, remote_engine_id: 'prefill-000000000000' }), 400, 'BAD_TRANSFER_PARAMS'],
    [
      'block ids beyond the pool',
      (p) => ({ ...p, remote_block_ids: p.remote_block_ids.map((g) => g.map((b) => b + 1_000_000)) }),
      400,
      'BAD_TRANSFER_PARAMS',
    ],
    ['forged grant (random hex)', (p) => ({ ...p, grant: randomBytes(16).toString('hex') }), 403, 'GRANT_DENIED'],
    ['pages of another transfer', (p) => ({ ...p, remote_block_ids: victim.remote_block_ids }), 403, 'GRANT_DENIED'],
    [
      'valid page ids outside the grant',
      (p) => ({ ...p, remote_block_ids: [notGranted(p, 4), notGranted(p, 8).slice(4)] }),
      403,
      'GRANT_DENIED',
    ],
    [
      'one page outside the grant',
      (p) => ({
        ...p,
        remote_block_ids: [[...p.remote_block_ids[0]!.slice(0, 3), ...notGranted(p, 1)], p.remote_block_ids[1]],
      }),
      403,
      'GRANT_DENIED',
    ],
  ];
  for (const [what, mutate, status, code] of cases) {
    assertError(await post(decode.url, { ...BODY, kv_transfer_params: mutate(await params()) }), status, code, what);
  }
  assert.equal(await metric(decode, 'handoff_transfer_bytes_read_total'), bytesRead, 'not one byte was read');
  const denied = cases.filter((c) => c[3] === 'GRANT_DENIED').length;
  // The victim's transfer was not disturbed by READs aimed at its pages.
  const victimBody = { ...BODY, prompt: VICTIM_PROMPT };
  assert.deepEqual(
    tokens(await post(decode.url, { ...victimBody, kv_transfer_params: victim })),
    tokens(await post(decode.url, victimBody)),
  );
  // A grant used with another transfer's id (the victim's, released by now): refused, and the grant's own
  // transfer is untouched (decode released the id it was given, not this one): its rightful use still works.
  const mine = await params();
  assertError(
    await post(decode.url, { ...BODY, kv_transfer_params: { ...mine, transfer_id: victim['transfer_id'] } }),
    403,
    'GRANT_DENIED',
    'another transfer id',
  );
  assert.deepEqual(
    tokens(await post(decode.url, { ...BODY, kv_transfer_params: mine })),
    tokens(await post(decode.url, BODY)),
  );
  const expired = await params(shortLease);
  await waitFor('the short lease ended', async () => (await metric(shortLease, 'handoff_leases_expired_total')) >= 1);
  const before = await metric(decode, 'handoff_transfer_bytes_read_total');
  // Refused by its producer, but the lease ended (grant_expires_ms is past): no fault of the client's params,
  // so decode recomputes (kvLoadFailurePolicy 'recompute') rather than answer 403.
  const local = tokens(await post(decode.url, BODY));
  assert.deepEqual(tokens(await post(decode.url, { ...BODY, kv_transfer_params: expired })), local, 'expired grant');
  assert.equal(
    await metric(decode, 'handoff_transfer_bytes_read_total'),
    before,
    'nothing read with the expired grant',
  );
  assert.equal(
    await metric(prefill, 'handoff_transfer_grants_refused_total'),
    refused + denied + 1,
    'each refusal counted by prefill',
  );
  assert.equal(
    await metric(shortLease, 'handoff_transfer_grants_refused_total'),
    1,
    'the expired grant refused by its producer',
  );
  assert.ok(
    (await metric(prefill, 'handoff_transfer_releases_refused_total')) >= 1,
    'releases with a forged grant were refused',
  );
  // Nothing leaks on all three: refused transfers are freed by their lease (a forged release is refused).
  await Promise.all([allPagesFree(decode), allPagesFree(prefill), allPagesFree(shortLease)]);
  // Both keep serving: P/D by hand and through the proxy.
  const ref = tokens(await post(decode.url, BODY));
  assert.deepEqual(tokens(await post(decode.url, { ...BODY, kv_transfer_params: await params() })), ref);
  assert.deepEqual(tokens(await post(proxy.url, BODY)), ref);
  await Promise.all([allPagesFree(decode), allPagesFree(prefill)]);
});
