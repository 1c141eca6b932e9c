/**
 * The router's feed client against a scripted instance (a tiny HTTP server): batches applied in order,
 * a gap answered with a dump, a hostile line breaking only the connection (the feed reconnects with the
 * applied seq as `since`), heartbeat load recorded. And the line parser refuses what it must.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import fc from 'fast-check';
import { KvEventFeed, ndjsonLines, parseFeedLine } from './kv_event_feed.ts';
import { RouterIndex } from './router_index.ts';

const env = new RealEnv(3);
const H = (c: string): string => c.repeat(64);
const stored = (h: string) => ({
  type: 'BlockStored',
  block_hashes: [h],
  parent_block_hash: null,
  token_ids: [1],
  block_size: 1,
  lora_id: null,
  medium: 'GPU',
  group_idx: 0,
});
const batch = (seq: number, h: string) => JSON.stringify({ epoch: 'e', seq, ts: 1, events: [stored(h)] });
const load = { running: 1, waiting: 2, held_for_send: 0, held_for_send_pages: 0, free_pages: 9, total_pages: 10 };
const beat = (seq: number) => JSON.stringify({ epoch: 'e', seq, heartbeat: true, load });

test('feed: applies batches, dumps on a gap, survives a hostile line by reconnecting with since', async () => {
  const sinces: string[] = [];
  let dumps = 0;
  const server = createServer((req, res) => {
    if (req.url === '/handoff/kv_events/dump') {
      dumps++;
      res.end(JSON.stringify({ epoch: 'e', seq: 2, block_hashes: [H('a'), H('b')] }));
      return;
    }
    sinces.push(new URL(req.url ?? '/', 'http://x').searchParams.get('since') ?? '');
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    if (sinces.length === 1) {
      // seq 1, then 3 (2 is missing: a gap), then a line that is not JSON.
      res.write(`${batch(1, H('a'))}\n${batch(3, H('c'))}\n${beat(3)}\n{not json\n`);
    } else res.write(`${batch(4, H('d'))}\n${beat(4)}\n`);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const index = new RouterIndex();
  const feed = new KvEventFeed('p', index, { url, apiKey: null, retryMs: 20, stallMs: 5000 }, env);
  feed.start();
  try {
    const deadline = env.nowMs() + 10_000;
    while (index.position('p').seq < 4 && env.nowMs() < deadline) await env.sleep(10);
    assert.equal(index.position('p').seq, 4);
    assert.equal(dumps, 1, 'one dump for the gap');
    assert.deepEqual([...index.hashesOf('p')].sort(), [H('a'), H('b'), H('c'), H('d')]);
    assert.deepEqual(sinces.slice(0, 2), ['0', '3'], 'reconnected after the bad line with the applied seq');
    assert.deepEqual(feed.load, load);
  } finally {
    await feed.close();
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  }
});

test('parseFeedLine refuses lines that are not batches or heartbeats', () => {
  const refuse = (s: string) =>
    assert.throws(
      () => parseFeedLine(s),
      (e: unknown) => e instanceof HandoffError && e.code === 'BAD_REQUEST',
      s,
    );
  refuse('[]');
  refuse('{"epoch":"e","seq":-1,"events":[]}');
  refuse('{"epoch":"","seq":1,"events":[]}');
  refuse('{"epoch":"e","seq":0,"events":[]}');
  refuse('{"epoch":"e","seq":1,"events":[{"type":"Nope"}]}');
  refuse('{"epoch":"e","seq":1,"events":[{"type":"BlockRemoved","block_hashes":["xyz"]}]}');
  refuse(`{"epoch":"${'e'.repeat(200)}","seq":1,"events":[]}`);
  const ok = parseFeedLine(batch(2, H('f')));
  assert.equal(ok.kind, 'batch');
  const hb = parseFeedLine(JSON.stringify({ epoch: 'e', seq: 0, heartbeat: true, load: { running: 'x' } }));
  assert.deepEqual(hb, { kind: 'heartbeat', epoch: 'e', seq: 0, load: null }, 'a malformed load is dropped');
});

test('feed: a dump that never answers is cut by the stall timer (the feed reconnects) and close() returns', async () => {
  let dumpsAsked = 0;
  const server = createServer((req, res) => {
    if (req.url === '/handoff/kv_events/dump') return void dumpsAsked++; // never answered
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    res.write(`${batch(1, H('a'))}\n${batch(3, H('c'))}\n`); // seq 2 missing: the feed asks for a dump
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const feed = new KvEventFeed('p', new RouterIndex(), { url, apiKey: null, retryMs: 20, stallMs: 300 }, env);
  feed.start();
  try {
    for (let k = 0; k < 500 && dumpsAsked < 2; k++) await env.sleep(10);
    assert.ok(dumpsAsked >= 2, `the stalled dump was given up and asked again (${dumpsAsked} asked)`);
    assert.ok(feed.stats.connects >= 2, 'the feed reconnected');
  } finally {
    let closed = false;
    const closing = feed.close().then(() => (closed = true));
    for (let k = 0; k < 300 && !closed; k++) await env.sleep(10);
    assert.ok(closed, 'close() returned while a dump was pending');
    await closing;
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  }
});

test('ndjsonLines: any lines in any chunks (split mid-character too) give the non-blank lines in order; an over-long partial line is refused', async () => {
  const chunked = async function* (bytes: Uint8Array, cuts: number[]): AsyncGenerator<Uint8Array> {
    let at = 0;
    for (const c of [...cuts.map((x) => x % (bytes.length + 1))].sort((a, b) => a - b)) {
      yield bytes.subarray(at, Math.max(at, c));
      at = Math.max(at, c);
    }
    yield bytes.subarray(at);
  };
  await fc.assert(
    fc.asyncProperty(
      fc.array(fc.oneof(fc.string({ unit: 'grapheme' }), fc.constant(''), fc.constant('  ')), { maxLength: 12 }),
      fc.array(fc.nat(), { maxLength: 20 }),
      async (lines, cuts) => {
        const clean = lines.map((l) => l.replace(/\n/g, ' '));
        const bytes = new TextEncoder().encode(clean.map((l) => `${l}\n`).join(''));
        const got: string[] = [];
        for await (const l of ndjsonLines(chunked(bytes, cuts), 1 << 20)) got.push(l);
        assert.deepEqual(
          got,
          clean.filter((l) => l.trim().length > 0),
        );
      },
    ),
  );
  const long = new TextEncoder().encode('x'.repeat(100));
  await assert.rejects(async () => {
    for await (const _ of ndjsonLines(chunked(long, [30, 60, 90]), 64));
  }, /longer than 64 bytes/);
});

const OLD = '1700000005000-dec-old';
const NEW = '1700000003000-dec-new'; // restarted 2 s "earlier" by its clock

test('feed: an instance restarted with its clock behind its old life is followed (the live process is the current life)', async () => {
  let life = 0;
  const server = createServer((req, res) => {
    if (req.url === '/handoff/kv_events/dump') {
      const d =
        life === 1 ? { epoch: OLD, seq: 3, block_hashes: [H('a')] } : { epoch: NEW, seq: 1, block_hashes: [H('b')] };
      return void res.end(JSON.stringify(d));
    }
    life++;
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    if (life === 1) {
      // Old life: stores A, then the process dies mid-stream (its last batches were lost; the connection drops).
      res.end(`${JSON.stringify({ epoch: OLD, seq: 1, ts: 1, events: [stored(H('a'))] })}\n`);
      return;
    }
    // New life: stores B; heartbeats every 50 ms.
    res.write(`${JSON.stringify({ epoch: NEW, seq: 1, ts: 1, events: [stored(H('b'))] })}\n`);
    const t = setInterval(() => res.write(`${JSON.stringify({ epoch: NEW, seq: 1, heartbeat: true, load })}\n`), 50);
    res.on('close', () => clearInterval(t));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const index = new RouterIndex();
  const feed = new KvEventFeed('d', index, { url, apiKey: null, retryMs: 20, stallMs: 5000 }, env);
  feed.start();
  try {
    await env.sleep(1500);
    assert.ok(life >= 2, 'the feed reconnected to the new life');
    assert.deepEqual(
      { epoch: index.position('d').epoch, hashes: [...index.hashesOf('d')] },
      { epoch: NEW, hashes: [H('b')] },
      'the index still credits the instance with the dead life',
    );
  } finally {
    await feed.close();
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  }
});
