/**
 * Proves: an instance whose heartbeats keep running ahead of its dumps (broken, or hostile) cannot take
 * the proxy's event loop. The feed's dump limit was "at most one dump a second", counted from the start
 * of the previous dump; but parsing and applying a dump of 100 k hashes (6.7 MB, far below the 96 MB
 * bound) takes the router's loop about a second, so the next dump started as soon as the previous one
 * was applied: back-to-back dumps kept the proxy's event loop ~100% busy (every client stream and health
 * check of the proxy stalled behind them), for as long as the instance kept it up. Now the next dump
 * also waits ten times what applying the last one cost: one instance's dumps take at most ~10% of it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';
import { RealEnv } from '../util/env.ts';
import { KvEventFeed } from './kv_event_feed.ts';
import { RouterIndex } from './router_index.ts';

const env = new RealEnv(17);
const H = (i: number): string => i.toString(16).padStart(64, '0');
const load = { running: 0, waiting: 0, held_for_send: 0, held_for_send_pages: 0, free_pages: 9, total_pages: 10 };

test('a feed whose heartbeats stay ahead of its dumps does not keep the router busy', async () => {
  const dump = Buffer.from(
    JSON.stringify({ epoch: 'e', seq: 1, block_hashes: Array.from({ length: 100_000 }, (_, i) => H(i + 1)) }),
  );
  const beat = `${JSON.stringify({ epoch: 'e', seq: 1_000_000, heartbeat: true, load })}\n`;
  const timers = new Set<NodeJS.Timeout>();
  const server = createServer((req, res) => {
    if (req.url === '/handoff/kv_events/dump') {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': dump.length });
      return void res.end(dump);
    }
    // Always ahead of its own dump: every heartbeat says a dump is needed.
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    res.write(beat);
    const t = setInterval(() => res.write(beat), 50);
    timers.add(t);
    res.on('close', () => clearInterval(t));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const index = new RouterIndex();
  const feed = new KvEventFeed('p', index, { url, apiKey: null, retryMs: 20, stallMs: 60_000 }, env);
  feed.start();
  try {
    for (let k = 0; k < 300 && feed.stats.dumps < 1; k++) await env.sleep(50);
    assert.ok(feed.stats.dumps >= 1, 'the first dump was applied');
    const from = performance.eventLoopUtilization();
    const dumpsBefore = feed.stats.dumps;
    await env.sleep(5000);
    const busy = performance.eventLoopUtilization(from).utilization;
    assert.ok(
      busy < 0.5,
      `the router's event loop was ${(busy * 100).toFixed(0)}% busy for 5 s applying ` +
        `${feed.stats.dumps - dumpsBefore} dumps of one broken instance`,
    );
  } finally {
    await feed.close();
    for (const t of timers) clearInterval(t);
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  }
});
