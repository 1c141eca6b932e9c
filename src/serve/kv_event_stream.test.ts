/**
 * The KV event feed of a live instance over HTTP (colocated engine on the in-process sim device): a
 * completion's prompt blocks arrive as BlockStored with the hashes a router computes from the same
 * tokens (kv/block_hash.ts); heartbeats say where the publisher is; `since` replays; the dump equals
 * the events replayed; bad `since` is a 400; the API key guards the feed; reset emits AllBlocksCleared.
 * A batch published right after the server ended its streams (shutdown) is not written to them.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { extendBlockHashes } from '../kv/block_hash.ts';
import type { KvEventBatch } from '../kv/kv_events.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance } from './instance.ts';
import { ndjsonLines } from './kv_event_feed.ts';
import { KvEventStreams, type KvEventSource } from './kv_event_stream.ts';

let inst: Instance;
const env = new RealEnv(5);

before(async () => {
  inst = await startInstance(
    {
      ...DEFAULT_INSTANCE_OPTIONS,
      port: 0,
      device: 'sim',
      numBlocks: 96,
      blockSize: 8,
      apiKey: 'k',
      scheduler: { maxModelLen: 256 },
    },
    env,
  );
});

after(async () => {
  await inst.close();
});

const auth = { authorization: 'Bearer k' };

async function complete(prompt: number[]): Promise<void> {
  const r = await fetch(`${inst.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...auth },
    body: JSON.stringify({ prompt, max_tokens: 2, temperature: 0 }),
  });
  assert.equal(r.status, 200, await r.text());
}

type Line = KvEventBatch | { epoch: string; seq: number; heartbeat: true; load: Record<string, number> };

/** Read lines of the feed until `until` says stop (bounded). */
async function readFeed(query: string, until: (lines: Line[]) => boolean): Promise<Line[]> {
  const ac = new AbortController();
  const r = await fetch(`${inst.url}/handoff/kv_events${query}`, { headers: auth, signal: ac.signal });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('content-type'), 'application/x-ndjson');
  const lines: Line[] = [];
  const timer = env.setTimer(10_000, () => ac.abort());
  try {
    for await (const text of ndjsonLines(r.body!, 1 << 20)) {
      lines.push(JSON.parse(text) as Line);
      if (until(lines)) break;
    }
  } finally {
    timer.cancel();
    ac.abort();
  }
  return lines;
}

const batches = (lines: Line[]): KvEventBatch[] => lines.filter((l): l is KvEventBatch => 'events' in l);

test('a prompt is published as BlockStored with the router-computable hashes; heartbeats, since and dump agree', async () => {
  const prompt = Array.from({ length: 20 }, (_, i) => 100 + i);
  const first = await readFeed('', (ls) => ls.length >= 1);
  const hb = first[0] as Extract<Line, { heartbeat: true }>;
  assert.equal(hb.heartbeat, true, 'the first line says where the publisher is');
  assert.equal(hb.epoch, inst.info.kv_events_epoch);
  assert.equal(typeof hb.load['free_pages'], 'number');
  const startSeq = hb.seq;
  const done = complete(prompt);
  const lines = await readFeed(`?since=${startSeq}`, (ls) =>
    batches(ls).some((b) => b.events.some((e) => e.type === 'BlockStored')),
  );
  await done;
  const stored = batches(lines).flatMap((b) => b.events.filter((e) => e.type === 'BlockStored'));
  const want = new Set(
    inst.info.prefix_cache_groups.flatMap((g) => extendBlockHashes([], prompt, inst.info.block_size, g, 2)),
  );
  const got = new Set(stored.flatMap((e) => (e.type === 'BlockStored' ? e.block_hashes : [])));
  for (const h of want) assert.ok(got.has(h), `the router's hash ${h.slice(0, 8)} was published`);
  const replay = batches(await readFeed('?since=0', (ls) => ls.some((l) => 'heartbeat' in l)));
  assert.deepEqual(
    replay.map((b) => b.seq),
    replay.map((_, i) => i + 1),
    'since=0 replays every batch, seq 1, 2, 3...',
  );
  const dump = (await (await fetch(`${inst.url}/handoff/kv_events/dump`, { headers: auth })).json()) as {
    seq: number;
    block_hashes: string[];
  };
  const replayed = new Set<string>();
  for (const b of replay)
    for (const e of b.events) {
      if (e.type === 'BlockStored') e.block_hashes.forEach((h) => replayed.add(h));
      if (e.type === 'BlockRemoved') e.block_hashes.forEach((h) => replayed.delete(h));
      if (e.type === 'AllBlocksCleared') replayed.clear();
    }
  assert.equal(dump.seq, replay.at(-1)?.seq);
  assert.deepEqual(new Set(dump.block_hashes), replayed);
});

test('the feed refuses a bad since and a missing key; a reset emits AllBlocksCleared', async () => {
  const bad = await fetch(`${inst.url}/handoff/kv_events?since=-1`, { headers: auth });
  assert.equal(bad.status, 400);
  assert.equal(((await bad.json()) as { error: { param: string } }).error.param, 'since');
  const anon = await fetch(`${inst.url}/handoff/kv_events/dump`);
  assert.equal(anon.status, 401);
  const before = await readFeed('', (ls) => ls.length >= 1);
  const r = await fetch(`${inst.url}/handoff/reset_prefix_cache`, { method: 'POST', headers: auth });
  assert.deepEqual(await r.json(), { reset: true });
  const lines = await readFeed(`?since=${before[0]!.seq}`, (ls) => ls.some((l) => 'heartbeat' in l));
  assert.equal(batches(lines).at(-1)?.events.at(-1)?.type, 'AllBlocksCleared');
});

test('closeAll ends every stream and stops feeding it: a batch published in the same turn is not written after the end', async () => {
  const listeners = new Set<(b: KvEventBatch) => void>();
  let seq = 0;
  const source: KvEventSource = {
    epoch: '1-e',
    get seq() {
      return seq;
    },
    since: () => [],
    dump: () => ({ epoch: '1-e', seq, block_hashes: [] }),
    flush: () => null,
    subscribe: (l) => {
      listeners.add(l);
      return () => listeners.delete(l);
    },
  };
  const load = { running: 0, waiting: 0, held_for_send: 0, held_for_send_pages: 0, free_pages: 1, total_pages: 1 };
  const streams = new KvEventStreams(source, () => load, env, 1000);
  const server = createServer((req, res) => streams.stream(req, res));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const errors: unknown[] = [];
  const onErr = (e: unknown): void => void errors.push(e);
  process.on('uncaughtException', onErr); // what killed the instance: write after end on a ServerResponse
  try {
    const r = await fetch(`http://127.0.0.1:${(server.address() as AddressInfo).port}/handoff/kv_events`);
    const reader = (r.body as ReadableStream<Uint8Array>).getReader();
    await reader.read(); // the first heartbeat
    assert.equal(listeners.size, 1);
    streams.closeAll();
    assert.equal(listeners.size, 0, 'unsubscribed at the end, not at the socket close');
    // An engine still running publishes in the same turn (pages withdrawn as requests are cancelled).
    for (const l of [...listeners]) l({ epoch: '1-e', seq: ++seq, ts: 0, events: [{ type: 'AllBlocksCleared' }] });
    await env.sleep(100);
    assert.deepEqual(
      errors.map((e) => (e as Error).message),
      [],
    );
    assert.equal(streams.numOpen, 0);
    // catch-ok: the stream was ended by the server; cancelling our side of it may fail, nothing to check
    await reader.cancel().catch(() => undefined);
  } finally {
    process.off('uncaughtException', onErr);
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  }
});
