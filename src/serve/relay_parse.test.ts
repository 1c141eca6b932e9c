/**
 * The proxy relays a non-streamed decode answer (up to UPSTREAM_BODY_MAX_BYTES, 64 MiB) without parsing
 * it when its Content-Length tells it is whole. relay() (proxy_relay.ts) ran JSON.parse over every JSON
 * answer only to tell a close-delimited body cut short: an answer with logprobs is millions of small
 * objects, and its parse blocked the proxy's event loop (every other client's stream, every health check)
 * for seconds. A body with a Content-Length is whole once fetch delivered that many bytes (undici fails a
 * shorter one), so only a body without it still needs the parse (proxy_truncated_stream.test.ts).
 *
 * Before the fix: the ~30 MiB answer below was parsed by the proxy (the spy saw it) and the event loop
 * stalled for as long as the parse took (printed). After: relayed unchanged, never parsed.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_PROXY_OPTIONS, Proxy } from './proxy.ts';

const env = new RealEnv(17);
const HELD = { do_remote_prefill: true, remote_engine_id: 'prefill-x', transfer_id: 't', grant: 'g' };

/** A completion with top-5 logprobs for `n` tokens: a big answer of many small objects. */
function bigAnswer(n: number): string {
  const lp = { tokens: [] as string[], token_logprobs: [] as number[], top_logprobs: [] as object[] };
  for (let i = 0; i < n; i++) {
    lp.tokens.push(` t${i}`);
    lp.token_logprobs.push(-0.25);
    lp.top_logprobs.push({ [` t${i}`]: -0.25, [` a${i}`]: -1.5, [` b${i}`]: -2.5, [` c${i}`]: -3, [` d${i}`]: -4 });
  }
  const text = lp.tokens.join('');
  return JSON.stringify({ id: 'c1', object: 'text_completion', choices: [{ index: 0, text, logprobs: lp }] });
}

async function upstream(answer: string): Promise<{ url: string; server: Server }> {
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url === '/health') return res.end('{}');
      if (req.url !== '/v1/completions') return res.writeHead(404).end('{}');
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(answer) });
      res.end(answer);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server };
}

test('a whole JSON answer with a Content-Length is relayed without a parse on the event loop', async () => {
  const prefill = await upstream(JSON.stringify({ choices: [{ text: 'x' }], kv_transfer_params: HELD }));
  const answer = bigAnswer(300_000);
  const decode = await upstream(answer);
  const urls = { prefillUrls: [prefill.url], decodeUrls: [decode.url] };
  const proxy = new Proxy({ ...DEFAULT_PROXY_OPTIONS, ...urls, healthTimeoutMs: 2000 }, env);
  const port = await proxy.listen(0, '127.0.0.1');
  await proxy.start();
  const parse = JSON.parse;
  let largestParsed = 0;
  JSON.parse = ((text: string, reviver?: Parameters<typeof parse>[1]) => {
    largestParsed = Math.max(largestParsed, String(text).length);
    return parse(text, reviver);
  }) as typeof JSON.parse;
  let last = performance.now();
  let stall = 0;
  const tick = setInterval(() => {
    stall = Math.max(stall, performance.now() - last);
    last = performance.now();
  }, 5);
  try {
    const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 4, logprobs: 5 }),
    });
    assert.equal(r.status, 200);
    assert.equal(await r.text(), answer, 'relayed unchanged');
    console.log(`answer ${(answer.length / 2 ** 20).toFixed(1)} MiB; longest event-loop stall ${stall.toFixed(0)} ms`);
    assert.ok(largestParsed < 1 << 20, `the proxy parsed a ${largestParsed}-character answer on its event loop`);
  } finally {
    clearInterval(tick);
    JSON.parse = parse;
    await proxy.close();
    for (const u of [prefill, decode]) {
      u.server.closeAllConnections();
      await new Promise((res) => u.server.close(res));
    }
  }
});
