/**
 * Proves: the router takes in an instance's large KV event dump a slice at a time, so its event loop
 * keeps turning (client streams, health checks) while it does. Before session 19 the feed parsed the
 * whole body with JSON.parse, checked every hash and built the instance's set (and a set per hash in a
 * reverse map nobody read) in one go: a dump of 1 Mi hashes held the proxy's event loop for 3-6 s.
 * The longest the loop waits between two turns during the dump is compared with what reading the same
 * body in one go costs, measured in the same run: it must be a small part of it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';
import { RealEnv } from '../util/env.ts';
import { KvEventFeed } from './kv_event_feed.ts';
import { RouterIndex } from './router_index.ts';

const env = new RealEnv(19);
const N = 300_000;
const H = (i: number): string => i.toString(16).padStart(64, '0');
const load = { running: 0, waiting: 0, held_for_send: 0, held_for_send_pages: 0, free_pages: 9, total_pages: 10 };

/** What the feed did before: the whole body at once (the baseline, in milliseconds). */
function wholeAtOnce(text: string): number {
  const t = performance.now();
  const v = JSON.parse(text) as { block_hashes: string[] };
  if (!v.block_hashes.every((h) => /^[0-9a-f]{64}$/.test(h))) throw new Error('bad hash');
  const set = new Set(v.block_hashes);
  assert.equal(set.size, N);
  return performance.now() - t;
}

test('a dump of 300 k hashes is read in slices: the event loop turns between them', async () => {
  const text = JSON.stringify({ epoch: 'e', seq: 5, block_hashes: Array.from({ length: N }, (_, i) => H(i + 1)) });
  const body = Buffer.from(text);
  const baselineMs = Math.min(wholeAtOnce(text), wholeAtOnce(text));
  const beat = `${JSON.stringify({ epoch: 'e', seq: 5, heartbeat: true, load })}\n`;
  const server = createServer((req, res) => {
    if (req.url === '/handoff/kv_events/dump') {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
      return void res.end(body);
    }
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    res.write(beat); // seq 5 while nothing is applied: the feed asks for a dump
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const index = new RouterIndex();
  const feed = new KvEventFeed('p', index, { url, apiKey: null, retryMs: 20, stallMs: 60_000 }, env);
  // The loop's turns, timed from the first one to the dump's end.
  let last = performance.now();
  let maxGapMs = 0;
  let ticking = true;
  const tick = (): void => {
    const now = performance.now();
    maxGapMs = Math.max(maxGapMs, now - last);
    last = now;
    if (ticking) setImmediate(tick);
  };
  setImmediate(tick);
  feed.start();
  try {
    for (let k = 0; k < 600 && feed.stats.dumps < 1; k++) await env.sleep(50);
    ticking = false;
    assert.equal(feed.stats.dumps, 1, 'the dump was applied');
    assert.equal(index.hashesOf('p').size, N);
    assert.equal(index.position('p').seq, 5);
    assert.ok(
      maxGapMs < baselineMs / 2,
      `the loop waited up to ${maxGapMs.toFixed(0)} ms between turns; the whole body at once takes ${baselineMs.toFixed(0)} ms`,
    );
    assert.ok(feed.stats.dumpYields >= Math.floor(N / 8192), `${feed.stats.dumpYields} slices`);
  } finally {
    ticking = false;
    await feed.close();
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  }
});
