/**
 * Proves: a KV event dump that arrives steadily but takes longer than the feed's stall bound (a large
 * cache over a slow link: the proxy's stallMs is 5 s, a 1 Mi-hash dump is ~70 MB) is applied. Before,
 * the stall timer was armed at the stream's last line and not re-armed while the dump's body came in
 * (the stream is not read during the dump), so every dump was aborted at `stallMs` however fast its
 * bytes flowed: the feed reconnected, the heartbeat was ahead again, the dump was cut again, and the
 * router's index never resynced (it kept routing by an empty or stale set forever).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { KvEventFeed } from './kv_event_feed.ts';
import { RouterIndex } from './router_index.ts';

const env = new RealEnv(15);
const H = (i: number): string => i.toString(16).padStart(64, '0');
const load = { running: 0, waiting: 0, held_for_send: 0, held_for_send_pages: 0, free_pages: 9, total_pages: 10 };
const beat = (seq: number): string => `${JSON.stringify({ epoch: 'e', seq, heartbeat: true, load })}\n`;

test('a dump that keeps coming for longer than the stall bound is applied, not cut on every retry', async () => {
  const hashes = Array.from({ length: 400 }, (_, i) => H(i + 1));
  const body = Buffer.from(JSON.stringify({ epoch: 'e', seq: 7, block_hashes: hashes }));
  let dumpsAsked = 0;
  const timers = new Set<NodeJS.Timeout>();
  const server = createServer((req, res) => {
    if (req.url === '/handoff/kv_events/dump') {
      dumpsAsked++;
      // ~1.2 s for the whole body, a chunk every 30 ms: never silent for long, slower than stallMs overall.
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
      const step = Math.ceil(body.length / 40);
      let at = 0;
      const t = setInterval(() => {
        res.write(body.subarray(at, at + step));
        at += step;
        if (at >= body.length) {
          clearInterval(t);
          res.end();
        }
      }, 30);
      timers.add(t);
      res.on('close', () => clearInterval(t));
      return;
    }
    // The instance is at seq 7; the router has nothing: the first heartbeat asks for a dump.
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    res.write(beat(7));
    const t = setInterval(() => res.write(beat(7)), 100);
    timers.add(t);
    res.on('close', () => clearInterval(t));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const index = new RouterIndex();
  const feed = new KvEventFeed('p', index, { url, apiKey: null, retryMs: 20, stallMs: 500 }, env);
  feed.start();
  try {
    const deadline = env.nowMs() + 6000;
    while (index.position('p').seq < 7 && env.nowMs() < deadline) await env.sleep(20);
    assert.equal(
      index.position('p').seq,
      7,
      `the dump was never applied (${dumpsAsked} asked, ${feed.stats.dumps} applied, ${feed.stats.connects} connects)`,
    );
    assert.equal(index.hashesOf('p').size, hashes.length);
    assert.equal(dumpsAsked, 1, 'one dump did it');
  } finally {
    await feed.close();
    for (const t of timers) clearInterval(t);
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  }
});
