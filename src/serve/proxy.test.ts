/**
 * The proxy in process over real instances (threaded devices, tcp transfer engines on loopback):
 * WRITE mode equals colocated token for token; READ with a dead prefill URL in the pool skips it;
 * errors of either side come back as the upstream's status and code; no healthy decode is a 502;
 * a client that disconnects mid-stream aborts the decode request, and every page comes back.
 * (READ through real processes and the CLI is test/e2e/serve.test.ts.)
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { request as httpRequest } from 'node:http';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance, type InstanceOptions } from './instance.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy, type ProxyOptions } from './proxy.ts';
import { SseParser } from './sse.ts';

const env = new RealEnv(11);
const DEAD = 'http://127.0.0.1:9'; // discard port: nothing listens there
let colocated: Instance;
let p1: Instance;
let d1: Instance;
let d2: Instance;
let pKeyed: Instance;
let p2: Instance;
let d3: Instance;
const proxies: Proxy[] = [];
const urls: Record<string, string> = {};

function opts(
  role: InstanceOptions['role'],
  extra: Record<string, unknown> = {},
  apiKey: string | null = null,
): InstanceOptions {
  return {
    ...DEFAULT_INSTANCE_OPTIONS,
    role,
    port: 0,
    numBlocks: 96,
    apiKey,
    scheduler: { maxModelLen: 512 },
    kvTransferConfig: role === 'both' ? null : JSON.stringify({ kv_connector_extra_config: extra }),
  };
}

async function proxy(
  name: string,
  o: Partial<ProxyOptions> & Pick<ProxyOptions, 'prefillUrls' | 'decodeUrls'>,
): Promise<void> {
  const p = new Proxy({ ...DEFAULT_PROXY_OPTIONS, healthTimeoutMs: 500, ...o }, env);
  const port = await p.listen(0, '127.0.0.1');
  await p.start();
  proxies.push(p);
  urls[name] = `http://127.0.0.1:${port}`;
}

before(async () => {
  [colocated, p1, d1, d2, p2, d3, pKeyed] = await Promise.all([
    startInstance(opts('both'), env),
    startInstance(opts('prefill', { lease_ms: 1500 }), env),
    startInstance(opts('decode'), env),
    startInstance(opts('decode', {}, 'decode-only'), env),
    startInstance(opts('prefill', { read_mode: false }), env),
    startInstance(opts('decode', { read_mode: false }), env),
    startInstance(opts('prefill', {}, 'prefill-only'), env),
  ]);
  await proxy('read', { prefillUrls: [DEAD, p1.url], decodeUrls: [d1.url], policy: 'least-loaded' });
  await proxy('keyedDecode', { prefillUrls: [p1.url], decodeUrls: [d2.url] });
  await proxy('keyedPrefill', { prefillUrls: [pKeyed.url], decodeUrls: [d1.url] });
  await proxy('write', { prefillUrls: [p2.url], decodeUrls: [d3.url], mode: 'write' });
  await proxy('noDecode', { prefillUrls: [p1.url], decodeUrls: [DEAD] });
});

after(async () => {
  await Promise.all(proxies.map((p) => p.close()));
  await Promise.all([colocated, p1, d1, d2, p2, d3, pKeyed].map((i) => i.close()));
});

async function complete(
  url: string,
  body: Record<string, unknown>,
): Promise<{ status: number; json: any; text: string }> {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const text = await r.text();
  let json: unknown = null;
  try {
    json = JSON.parse(text);
  } catch {
    json = null;
  }
  return { status: r.status, json, text };
}

async function settle(...insts: Instance[]): Promise<void> {
  for (let k = 0; k < 3000 && !insts.every((i) => i.engine.core.isIdle()); k++) await env.sleep(5);
  for (const i of insts) assert.equal(i.engine.kv.getNumFreeBlocks(), 95, `${i.info.role}: every page back`);
}

const prompts = ['The quick brown fox jumps over the lazy dog, and then', 'A much longer prompt '.repeat(6)];

test('WRITE through the proxy: the same tokens as colocated (greedy and seeded sampling), pages freed on both sides', async () => {
  for (const prompt of prompts) {
    for (const sampling of [{ temperature: 0 }, { temperature: 0.8, seed: 1234 }]) {
      const body = { prompt, max_tokens: 12, ignore_eos: true, return_token_ids: true, ...sampling };
      const ref = await complete(colocated.url, body);
      const pd = await complete(urls['write']!, body);
      assert.equal(pd.status, 200, pd.text);
      assert.deepEqual(
        pd.json.choices[0].token_ids,
        ref.json.choices[0].token_ids,
        `${prompt.slice(0, 20)} ${JSON.stringify(sampling)}`,
      );
    }
  }
  await settle(p2, d3);
  const text = await (await fetch(`${d3.url}/metrics`)).text();
  assert.match(text, /^handoff_transfer_bytes_written_total\{[^}]*\} 0$/m, 'decode wrote nothing');
  const written = /^handoff_transfer_bytes_written_total\{[^}]*\} (\d+)$/m.exec(
    await (await fetch(`${p2.url}/metrics`)).text(),
  );
  assert.ok(Number(written?.[1]) > 0, 'prefill pushed the KV with WRITEs');
});

test('READ with a dead prefill in the pool: it is skipped; streamed output equals colocated', async () => {
  const pool = proxies[0]!.prefill;
  assert.equal(pool.members[0]?.healthy, false);
  const body = { prompt: prompts[0], max_tokens: 9, temperature: 0, ignore_eos: true };
  const ref = await complete(colocated.url, body);
  for (let i = 0; i < 3; i++) {
    const s = await complete(urls['read']!, { ...body, stream: true });
    assert.equal(s.status, 200, s.text);
    const text = new SseParser()
      .push(s.text)
      .filter((e) => e !== '[DONE]')
      .map((e) => JSON.parse(e).choices[0]?.text ?? '')
      .join('');
    assert.equal(text, ref.json.choices[0].text);
  }
  assert.equal(pool.members[1]?.served, 3);
  await settle(p1, d1);
  const read = /^handoff_transfer_bytes_read_total\{[^}]*\} (\d+)$/m.exec(
    await (await fetch(`${d1.url}/metrics`)).text(),
  );
  assert.ok(Number(read?.[1]) > 0, 'decode pulled the KV with READs (not a local recompute)');
});

test('errors: prefill 4xx and decode 4xx come back with their status and code; no healthy decode is a 502; held pages are freed by the lease', async () => {
  // The proxy refuses what no instance would take, with the instances' own validation.
  const bad = await complete(urls['read']!, { prompt: 42 });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.code, 'BAD_REQUEST');
  // Prefill refuses (it wants an API key): prefill's 401 comes back, decode is never asked.
  const prefillRefused = await complete(urls['keyedPrefill']!, { prompt: 'some prompt here', max_tokens: 4 });
  assert.equal(prefillRefused.status, 401, prefillRefused.text);
  assert.equal(prefillRefused.json.error.code, 'UNAUTHORIZED');
  assert.match(prefillRefused.json.error.message, /^prefill: /);
  // Too long for decode's max_model_len: refused by the proxy before prefill computes anything.
  const served = proxies[0]!.prefill.members[1]!.served;
  const tooLong = await complete(urls['read']!, { prompt: 'word '.repeat(300), max_tokens: 300 });
  assert.equal(tooLong.status, 400, tooLong.text);
  assert.equal(tooLong.json.error.code, 'PROMPT_TOO_LONG');
  assert.equal(proxies[0]!.prefill.members[1]!.served, served, 'prefill never saw it');
  // Prefill accepts, decode refuses (it wants an API key prefill does not): decode's 401 comes back.
  const refused = await complete(urls['keyedDecode']!, { prompt: 'some prompt here', max_tokens: 4 });
  assert.equal(refused.status, 401, refused.text);
  assert.equal(refused.json.error.code, 'UNAUTHORIZED');
  assert.match(refused.json.error.message, /^decode: /);
  const none = await complete(urls['noDecode']!, { prompt: 'x', max_tokens: 2 });
  assert.equal(none.status, 502);
  assert.equal(none.json.error.code, 'PEER_UNAVAILABLE');
  assert.equal((await fetch(`${urls['noDecode']}/health`)).status, 503);
  // Decode never read prefill's pages: the lease frees them.
  await settle(p1, d2);
});

test('a client that disconnects mid-stream through the proxy aborts decode; every page comes back', async () => {
  await new Promise<void>((resolve, reject) => {
    const timer = env.setTimer(15_000, () => reject(new Error('no first chunk')));
    const u = new URL(`${urls['read']}/v1/completions`);
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
          timer.cancel();
          req.destroy();
          resolve();
        });
      },
    );
    req.on('error', () => undefined);
    req.end(JSON.stringify({ prompt: prompts[1], max_tokens: 400, ignore_eos: true, stream: true }));
  });
  await settle(p1, d1);
  const text = await (await fetch(`${d1.url}/metrics`)).text();
  assert.match(text, /^handoff_requests_total\{finish_reason="abort"[^}]*\} 1$/m);
});

test('POST /handoff/release on decode: pages prefill held for a request decode will never get come back by release, not by the lease (dynamo #13855, vLLM #50425)', async () => {
  const leasesExpired = async (): Promise<number> => {
    const text = await (await fetch(`${p1.url}/metrics`)).text();
    return Number(/^handoff_leases_expired_total(?:\{[^}]*\})? (\d+)$/m.exec(text)?.[1] ?? NaN);
  };
  await settle(p1, d1);
  const before = await leasesExpired();
  const transfer = { do_remote_decode: true, do_remote_prefill: false, transfer_id: 'xfer-release-test' };
  const answer = await complete(p1.url, { prompt: prompts[1], max_tokens: 1, kv_transfer_params: transfer });
  assert.equal(answer.status, 200, answer.text);
  assert.ok(p1.engine.kv.getNumFreeBlocks() < 95, 'prefill holds its pages for decode');
  const release = (url: string): Promise<Response> =>
    fetch(`${url}/handoff/release`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        kv_transfer_params: { ...answer.json.kv_transfer_params, do_remote_prefill: true, do_remote_decode: false },
      }),
    });
  const wrongSide = await release(p1.url);
  assert.equal(wrongSide.status, 400, 'only a decode instance releases a READ it will not load');
  for (const body of ['{}', '{"kv_transfer_params": null}', '{"kv_transfer_params": 5}', '[1]', 'nope']) {
    const bad = await fetch(`${d1.url}/handoff/release`, { method: 'POST', body });
    assert.equal(bad.status, 400, `${body}: a 400 naming what is wrong`);
  }
  const r = await release(d1.url);
  assert.equal(r.status, 200);
  assert.deepEqual(await r.json(), { released: true });
  await settle(p1, d1);
  assert.equal(await leasesExpired(), before, 'freed by the release, not by the lease');
});
