/**
 * Faults with real processes on loopback (issue 8): `handoff serve` prefill/decode children with the
 * test-only fault switch of kv_connector_extra_config (read_delay_ms = a slow NIC, read_error_rate,
 * drop_notification_rate), SIGKILLed peers and the real proxy. Proves, for each fault: the request
 * completes with the colocated tokens (kvLoadFailurePolicy = recompute, counted in
 * handoff_kv_load_failures_total) and never hangs, the pages return to the pool on both sides (free
 * pages in /metrics back to the total), the race checker stays clean, and every server keeps serving.
 * The colocated reference is the decode server itself, asked without kv_transfer_params.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { RealEnv } from '../../src/util/env.ts';
import { spawnHandoff, type ChildServer } from '../../src/cli/children.ts';
import {
  allPagesFree as allFree,
  metric,
  post as postWithin,
  tokens,
  waitFor as waitWithin,
  type Reply,
} from './kit.ts';

const env = new RealEnv(8);
const NUM_BLOCKS = 192;
const TOTAL_PAGES = NUM_BLOCKS - 1;
/** A request still unanswered after this is hung (a liveness bound, far above any deadline used here). */
const HANG_MS = 45_000;
const children: ChildServer[] = [];
const post = (url: string, body: unknown): Promise<Reply> => postWithin(url, body, HANG_MS);
const waitFor = (what: string, cond: () => Promise<boolean>, boundMs?: number): Promise<void> =>
  waitWithin(env, what, cond, boundMs);
const allPagesFree = (c: ChildServer): Promise<void> => allFree(env, c, TOTAL_PAGES);

after(async () => {
  await Promise.all(children.map((c) => c.stop(2000)));
  for (const c of children) assert.ok(c.exited, `pid ${c.pid} exited`);
});

type Extra = Record<string, unknown>;

/** One `handoff serve` child (dsv4-mini, READ mode over tcp) with extra kv_connector_extra_config keys. */
async function serve(role: 'prefill' | 'decode', extra: Extra = {}, flags: string[] = []): Promise<ChildServer> {
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
    '512',
    '--kv-transfer-config',
    config,
    ...flags,
  ];
  const c = await spawnHandoff(args, env, { env: { HANDOFF_LOG_LEVEL: 'error' } });
  children.push(c);
  return c;
}

async function spawnAll<T extends Array<() => Promise<ChildServer>>>(...makers: T): Promise<ChildServer[]> {
  return Promise.all(makers.map((m) => m()));
}

const bodyFor = (prompt: string, extra: Extra = {}): Extra => ({
  model: 'dsv4-mini',
  prompt,
  max_tokens: 8,
  temperature: 0,
  ignore_eos: true,
  return_token_ids: true,
  ...extra,
});

/** The vLLM proxy's first half, by hand: prefill with max_tokens 1 and do_remote_decode; returns the params. */
async function prefillParams(prefill: ChildServer, body: Extra): Promise<Extra> {
  const r = await post(prefill.url, {
    ...body,
    stream: false,
    max_tokens: 1,
    kv_transfer_params: { do_remote_decode: true },
  });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  const p = r.json['kv_transfer_params'] as Extra;
  assert.ok(
    typeof p['grant'] === 'string' && Array.isArray(p['remote_block_ids']),
    'prefill returned a grant and its blocks',
  );
  return p;
}

/** Poll until `cond` holds (bounded: a liveness check, not a speed check). */

const PROMPTS = [
  'A prefill server computes the prompt, and the decode server pulls the pages it needs, then',
  'Short prompt',
  'The grant names the pages, the peer and the transfer; anything else is refused. '.repeat(3),
  'Pages go back to the pool when the lease ends, even if nobody ever calls back to say so.',
];

test('prefill SIGKILLed while decode READ is pending: recomputed to the colocated tokens, pages freed, decode keeps serving (also with a prefill restarted on the same ports)', async () => {
  // A slow NIC: every READ waits 1500 ms before it starts; the step deadline (5000 ms) is longer.
  const [prefill, decode] = await spawnAll(
    () => serve('prefill'),
    () => serve('decode', { faults: { read_delay_ms: 1500 }, transfer_timeout_ms: 5000 }, ['--race-check']),
  );
  const body = bodyFor(PROMPTS[0]!);
  const ref = tokens(await post(decode!.url, body));
  // Warm up: the P/D path works through the slow NIC (and opens the data connection to this prefill).
  assert.deepEqual(
    tokens(await post(decode!.url, { ...body, kv_transfer_params: await prefillParams(prefill!, body) })),
    ref,
  );
  await allPagesFree(decode!);
  const failures = await metric(decode!, 'handoff_kv_load_failures_total');
  const reads = await metric(decode!, 'handoff_transfer_reads_total');
  assert.equal(failures, 0, 'the warm-up READ succeeded');

  const params = await prefillParams(prefill!, body);
  const pending = post(decode!.url, { ...body, kv_transfer_params: params });
  await waitFor('decode posted its READ', async () => (await metric(decode!, 'handoff_transfer_reads_total')) > reads);
  prefill!.child.kill('SIGKILL');
  await prefill!.stop();
  const r = await pending;
  assert.deepEqual(tokens(r), ref, 'recomputed locally to the colocated tokens');
  assert.equal(
    await metric(decode!, 'handoff_kv_load_failures_total'),
    failures + 1,
    'the READ failed and was recomputed',
  );
  assert.ok((await metric(decode!, 'handoff_transfer_read_failures_total')) >= 1);
  await allPagesFree(decode!);
  assert.equal(
    await metric(decode!, 'handoff_races_total'),
    0,
    'no unordered page access (the failed READ was ordered before the pages were re-zeroed)',
  );

  // Decode keeps serving: locally, and P/D with a prefill restarted on the same KV ports (a new engine
  // id at the address decode handshook before: decode must not trust its cached handshake).
  const other = bodyFor(PROMPTS[3]!, { temperature: 0.8, seed: 7 });
  const otherRef = tokens(await post(decode!.url, other));
  const prefill2 = await serve('prefill', {}, [
    '--transfer-port',
    String(prefill!.ready['sideChannelPort']),
    '--transfer-data-port',
    String(prefill!.ready['dataPort']),
  ]);
  assert.notEqual(prefill2.ready['engineId'], prefill!.ready['engineId']);
  assert.deepEqual(
    tokens(await post(decode!.url, { ...other, kv_transfer_params: await prefillParams(prefill2, other) })),
    otherRef,
  );
  assert.equal(await metric(decode!, 'handoff_kv_load_failures_total'), failures + 1, 'the new READ succeeded');
  await Promise.all([allPagesFree(decode!), allPagesFree(prefill2)]);
});

test('decode never reading, or SIGKILLed mid-READ: prefill frees the held pages when the lease ends and keeps serving', async () => {
  const [prefill, slowDecode, decode] = await spawnAll(
    () => serve('prefill', { lease_ms: 1500 }),
    () => serve('decode', { faults: { read_delay_ms: 5000 } }),
    () => serve('decode'),
  );
  await allPagesFree(prefill!);
  // Never reading: the params are simply dropped.
  await prefillParams(prefill!, bodyFor(PROMPTS[2]!));
  assert.ok((await metric(prefill!, 'handoff_kv_free_pages')) < TOTAL_PAGES, 'pages held for the decode peer');
  assert.equal(await metric(prefill!, 'handoff_num_requests_held_for_send'), 1);
  await allPagesFree(prefill!);
  assert.equal(await metric(prefill!, 'handoff_leases_expired_total'), 1, 'freed by the lease');
  assert.equal(await metric(prefill!, 'handoff_num_requests_held_for_send'), 0);

  // Decode killed while its READ waits in the slow NIC: no release ever comes.
  const body = bodyFor(PROMPTS[0]!);
  const params = await prefillParams(prefill!, body);
  const doomed = post(slowDecode!.url, { ...body, kv_transfer_params: params }).then(
    () => 'answered',
    () => 'connection lost',
  );
  await waitFor(
    'the slow decode posted its READ',
    async () => (await metric(slowDecode!, 'handoff_transfer_reads_total')) === 1,
  );
  slowDecode!.child.kill('SIGKILL');
  await slowDecode!.stop();
  assert.equal(await doomed, 'connection lost');
  await allPagesFree(prefill!);
  assert.equal(await metric(prefill!, 'handoff_leases_expired_total'), 2);

  // Prefill keeps serving: a P/D request with the other decode gives the colocated tokens.
  const ref = tokens(await post(decode!.url, body));
  assert.deepEqual(
    tokens(await post(decode!.url, { ...body, kv_transfer_params: await prefillParams(prefill!, body) })),
    ref,
  );
  assert.equal(await metric(decode!, 'handoff_kv_load_failures_total'), 0);
  await Promise.all([allPagesFree(prefill!), allPagesFree(decode!)]);
  assert.equal(
    await metric(prefill!, 'handoff_leases_expired_total'),
    2,
    'the successful transfer was released, not expired',
  );
});

test('READ errors at rate 0.5 and dropped notifications through the real proxy: colocated tokens, no hang, pages back on both sides', async (t) => {
  // Decode drops half of its notifications (the releases prefill waits for); prefill's short lease frees those pages.
  const [prefill, decode] = await spawnAll(
    () => serve('prefill', { lease_ms: 2000 }),
    () =>
      serve('decode', { faults: { read_error_rate: 0.5, drop_notification_rate: 0.5 }, transfer_timeout_ms: 5000 }, [
        '--race-check',
      ]),
  );
  const proxy = await spawnHandoff(['proxy', '--prefill', prefill!.url, '--decode', decode!.url, '--port', '0'], env, {
    env: { HANDOFF_LOG_LEVEL: 'error' },
  });
  children.push(proxy);
  const bodies = Array.from({ length: 16 }, (_, i) =>
    bodyFor(`${PROMPTS[i % PROMPTS.length]} #${i}`, i % 2 === 0 ? {} : { temperature: 0.9, seed: 100 + i }),
  );
  const refs: number[][] = [];
  for (const b of bodies) refs.push(tokens(await post(decode!.url, b)));
  // Four at a time, so READs of different requests share steps.
  const got: number[][] = new Array<number[]>(bodies.length);
  for (let i = 0; i < bodies.length; i += 4) {
    const batch = await Promise.all(bodies.slice(i, i + 4).map((b) => post(proxy.url, b)));
    batch.forEach((r, k) => (got[i + k] = tokens(r)));
  }
  got.forEach((t, i) => assert.deepEqual(t, refs[i], `request ${i} equals colocated`));
  const loadFailures = await metric(decode!, 'handoff_kv_load_failures_total');
  assert.ok(
    loadFailures >= 1 && loadFailures <= bodies.length,
    `some READs failed and were recomputed (${loadFailures})`,
  );
  assert.ok((await metric(decode!, 'handoff_transfer_read_failures_total')) >= 1);
  await Promise.all([allPagesFree(prefill!), allPagesFree(decode!)]);
  assert.ok((await metric(prefill!, 'handoff_leases_expired_total')) >= 1, 'dropped releases were freed by the lease');
  await waitFor(
    'dropped notifications timed out on decode',
    async () => (await metric(decode!, 'handoff_transfer_notifications_failed_total')) >= 1,
  );
  assert.equal(await metric(decode!, 'handoff_races_total'), 0);
  assert.equal(await metric(prefill!, 'handoff_transfer_grants_refused_total'), 0);
  const dropped = await metric(decode!, 'handoff_transfer_notifications_failed_total');
  t.diagnostic(
    `${bodies.length} requests: ${loadFailures} READs failed and were recomputed; ${await metric(prefill!, 'handoff_leases_expired_total')} leases expired (${dropped} dropped releases timed out so far)`,
  );
});

test('a NIC slower than the step deadline: every READ times out, is aborted and recomputed; pages back on both sides', async () => {
  const [prefill, decode] = await spawnAll(
    () => serve('prefill'),
    () => serve('decode', { faults: { read_delay_ms: 3000 }, transfer_timeout_ms: 300 }, ['--race-check']),
  );
  for (const [i, prompt] of PROMPTS.entries()) {
    const body = bodyFor(prompt);
    const ref = tokens(await post(decode!.url, body));
    assert.deepEqual(
      tokens(await post(decode!.url, { ...body, kv_transfer_params: await prefillParams(prefill!, body) })),
      ref,
    );
    assert.equal(
      await metric(decode!, 'handoff_kv_load_failures_total'),
      i + 1,
      'the READ timed out and was recomputed',
    );
  }
  assert.equal(await metric(decode!, 'handoff_transfer_bytes_read_total'), 0, 'no byte landed');
  await Promise.all([allPagesFree(prefill!), allPagesFree(decode!)]);
  assert.equal(
    await metric(prefill!, 'handoff_leases_expired_total'),
    0,
    'decode released every transfer it gave up on',
  );
  assert.equal(await metric(decode!, 'handoff_races_total'), 0);
});

/** Decode's established side-channel sockets to `port` on loopback (ss, root namespace). */
const sideChannels = (port: unknown): string[] =>
  execFileSync('ss', ['-Htn', 'state', 'established', 'dst', '127.0.0.1', 'dport', '=', `:${String(port)}`], {
    encoding: 'utf8',
  })
    .split('\n')
    .filter((l) => l.trim() !== '');

test('the side channel to a live prefill is killed (ss -K): decode handshakes again, the next READ loads, releases free prefill pages before any lease', async (t) => {
  if (process.getuid?.() !== 0) return t.skip('needs root for ss -K');
  const [prefill, decode] = await spawnAll(
    () => serve('prefill'),
    () => serve('decode'),
  );
  const port = prefill!.ready['sideChannelPort'];
  const pd = async (prompt: string): Promise<void> => {
    const body = bodyFor(prompt);
    const ref = tokens(await post(decode!.url, body));
    assert.deepEqual(
      tokens(await post(decode!.url, { ...body, kv_transfer_params: await prefillParams(prefill!, body) })),
      ref,
      prompt,
    );
  };
  await pd(PROMPTS[0]!);
  assert.equal(sideChannels(port).length, 1, 'one side channel from decode to prefill');
  try {
    execFileSync('ss', ['-K', 'dst', '127.0.0.1', 'dport', '=', `:${String(port)}`], { stdio: 'ignore' });
  } catch {
    /* ss reports families it cannot filter; what counts is whether the socket is gone */
  }
  if (sideChannels(port).length !== 0) return t.skip('this kernel cannot destroy sockets (CONFIG_INET_DIAG_DESTROY)');
  await pd(PROMPTS[2]!); // may be recomputed: the engine learns here that the peer's channel is gone
  const failures = await metric(decode!, 'handoff_kv_load_failures_total');
  assert.ok(failures <= 1);
  await pd(PROMPTS[3]!);
  assert.equal(
    await metric(decode!, 'handoff_kv_load_failures_total'),
    failures,
    'loaded over a new handshake, not recomputed',
  );
  assert.equal(sideChannels(port).length, 1, 'a new side channel');
  // The default lease is 60 s: pages coming back now means every release arrived.
  await Promise.all([allPagesFree(prefill!), allPagesFree(decode!)]);
  assert.equal(await metric(prefill!, 'handoff_leases_expired_total'), 0);
});
