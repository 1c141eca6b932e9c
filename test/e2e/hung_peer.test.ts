/**
 * A hung prefill host cannot freeze decode (issue 11, item 2). Decode (a real `handoff serve` process)
 * is sent requests whose kv_transfer_params name a prefill side channel that accepts the TCP connection
 * and never answers. Their handshakes run off the step path: while they are pending, a concurrent
 * stream's inter-token latency p99 stays within 2x its baseline (+ a small slack for a 2-core machine),
 * a plain request is answered, and the hung requests themselves end once the handshake times out,
 * with the documented 400 (an engine this decode never reached, at an address that does not answer).
 * A producer decode did reach before and that stops answering is recomputed instead
 * (test/e2e/faults.test.ts). Peers outside the allow-list (--kv-peers) are refused with a 403 and never
 * contacted.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../../src/util/env.ts';
import { spawnHandoff, type ChildServer } from '../../src/cli/children.ts';
import { allPagesFree, post, tokens } from './kit.ts';

const env = new RealEnv(11);
const NUM_BLOCKS = 256;
let decode: ChildServer;
let hung: Server;
let hungPort = 0;
const accepted: Socket[] = [];
/** A loopback listener that is not on decode's allow-list: it must never see a connection. */
let outsider: Server;
let outsiderPort = 0;
let outsiderConnections = 0;

before(async () => {
  hung = createServer((s) => {
    accepted.push(s); // accept, never answer
    s.on('error', () => undefined);
  });
  await new Promise<void>((r) => hung.listen(0, '127.0.0.1', r));
  hungPort = (hung.address() as AddressInfo).port;
  outsider = createServer((s) => {
    outsiderConnections++;
    s.destroy();
  });
  await new Promise<void>((r) => outsider.listen(0, '127.0.0.1', r));
  outsiderPort = (outsider.address() as AddressInfo).port;
  const config = JSON.stringify({ kv_connector: 'OneSidedConnector', kv_connector_extra_config: { read_mode: true } });
  decode = await spawnHandoff(
    [
      'serve',
      '--role',
      'decode',
      '--model',
      'dsv4-mini',
      '--port',
      '0',
      '--num-blocks',
      String(NUM_BLOCKS),
      '--kv-transfer-config',
      config,
      '--kv-peers',
      `127.0.0.1:${hungPort}`,
    ],
    env,
    { env: { HANDOFF_LOG_LEVEL: 'error' } },
  );
});

after(async () => {
  await decode.stop(2000);
  for (const s of accepted) s.destroy();
  await new Promise<void>((r) => hung.close(() => r()));
  await new Promise<void>((r) => outsider.close(() => r()));
});

// 20 tokens as ids: 2 pages per transfer group (16-token pages), 2 groups on dsv4-mini.
const PROMPT = Array.from({ length: 20 }, (_, i) => 1000 + i * 37);
const hungParams = (i: number, host = '127.0.0.1', port = hungPort) => ({
  do_remote_prefill: true,
  do_remote_decode: false,
  remote_engine_id: `prefill-hung-${i}`,
  remote_host: host,
  remote_port: port,
  remote_block_ids: [
    [5, 6],
    [7, 8],
  ],
  transfer_id: `hung-${i}`,
  grant: 'ab'.repeat(16),
});

/** Inter-token gaps (ms) of one streamed completion. */
async function streamGaps(maxTokens: number): Promise<number[]> {
  const r = await fetch(`${decode.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      prompt: 'The stream goes on while a prefill host hangs',
      max_tokens: maxTokens,
      temperature: 0,
      ignore_eos: true,
      stream: true,
    }),
    signal: AbortSignal.timeout(60_000),
  });
  assert.equal(r.status, 200);
  const gaps: number[] = [];
  let last: number | null = null;
  const decoder = new TextDecoder();
  for await (const chunk of r.body as AsyncIterable<Uint8Array>) {
    const n = decoder
      .decode(chunk)
      .split('\n')
      .filter((l) => l.startsWith('data: {')).length;
    const now = env.nowMs();
    for (let i = 0; i < n; i++) {
      if (last !== null) gaps.push(i === 0 ? now - last : 0);
      last = now;
    }
  }
  return gaps;
}

const p99 = (xs: number[]): number =>
  [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * 0.99))] ?? 0;

test('hung prefill host: handshakes run off the step path; a concurrent stream keeps its ITL, the hung requests end with a 400', async () => {
  await streamGaps(8); // warm up
  const base = p99(await streamGaps(48));
  const local = tokens(
    await post(
      decode.url,
      { prompt: PROMPT, max_tokens: 4, temperature: 0, ignore_eos: true, return_token_ids: true },
      30_000,
    ),
  );
  const t0 = env.nowMs();
  const hungReqs = [0, 1, 2].map((i) =>
    post(
      decode.url,
      {
        prompt: PROMPT,
        max_tokens: 4,
        temperature: 0,
        ignore_eos: true,
        return_token_ids: true,
        kv_transfer_params: hungParams(i),
      },
      60_000,
    ),
  );
  await env.sleep(100);
  const plainStart = env.nowMs();
  const plain = await post(decode.url, { prompt: 'a plain request', max_tokens: 2, temperature: 0 }, 30_000);
  const plainMs = env.nowMs() - plainStart;
  const during = p99(await streamGaps(48));
  const streamEndMs = env.nowMs() - t0;
  console.log(
    `ITL p99 baseline ${base} ms, with 3 hung handshakes ${during} ms; plain request ${plainMs} ms; stream done ${streamEndMs} ms after the hung requests`,
  );
  assert.equal(plain.status, 200);
  assert.ok(
    plainMs < 4000,
    `a plain request is answered while handshakes hang (${plainMs} ms; the handshake timeout is 5000 ms)`,
  );
  assert.ok(accepted.length >= 1, 'decode did contact the hung peer');
  assert.ok(during <= 2 * base + 50, `ITL p99 ${during} ms with a hung peer vs ${base} ms baseline`);
  for (const r of await Promise.all(hungReqs)) {
    assert.equal(r.status, 400, JSON.stringify(r.json));
    assert.equal(r.json.error?.code, 'BAD_TRANSFER_PARAMS');
    assert.match(r.json.error?.message ?? '', /unknown here and 127\.0\.0\.1:\d+ does not answer/);
  }
  assert.equal(
    tokens(
      await post(
        decode.url,
        { prompt: PROMPT, max_tokens: 4, temperature: 0, ignore_eos: true, return_token_ids: true },
        30_000,
      ),
    ).length,
    local.length,
  );
  await allPagesFree(env, decode, NUM_BLOCKS - 1);
});

test('--kv-peers: a producer outside the allow-list is refused with 403 PEER_NOT_ALLOWED and never contacted', async () => {
  const r = await post(
    decode.url,
    { prompt: PROMPT, max_tokens: 2, kv_transfer_params: hungParams(9, '127.0.0.1', outsiderPort) },
    10_000,
  );
  assert.equal(r.status, 403, JSON.stringify(r.json));
  assert.equal(r.json.error?.code, 'PEER_NOT_ALLOWED');
  await env.sleep(200);
  assert.equal(outsiderConnections, 0, 'no connection was made to the refused peer');
  assert.equal((await post(decode.url, { prompt: 'still serving', max_tokens: 2 }, 10_000)).status, 200);
});
