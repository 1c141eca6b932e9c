/**
 * An instance's reported load (kv-aware routing's `running + waiting`, kv_router.ts loadOf) must not
 * outlive its KV event feed. The load comes only with the feed's heartbeats; when the feed breaks and
 * cannot reconnect (the stream answers 503 or errors, or stalls, while /health still passes), the last
 * figure stayed on the member for good: an instance that reported 40 requests queued just before its
 * feed broke kept scoring 40 requests worse than its peers, and the router starved it however idle it
 * became (or kept sending to one that reported idle and is not).
 *
 * Before the fix: after the feed broke, `feed.load` and the member's load (onLoad) still held the last
 * heartbeat's {running: 40, ...}. After: they are null once the connection that reported it ended, so
 * the router counts the requests it has in flight there, as for an instance with no feed.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { KvEventFeed } from './kv_event_feed.ts';
import type { InstanceLoad } from './kv_event_stream.ts';
import { RouterIndex } from './router_index.ts';

const env = new RealEnv(5);
const busy = { running: 40, waiting: 0, held_for_send: 0, held_for_send_pages: 0, free_pages: 1, total_pages: 10 };

test('feed: the load of a feed that broke and cannot reconnect is forgotten, not kept for good', async () => {
  let connects = 0;
  const server = createServer((req, res) => {
    if (!String(req.url).startsWith('/handoff/kv_events')) return void res.writeHead(404).end();
    connects++;
    if (connects > 1) return void res.writeHead(503).end('{}'); // the feed is broken from now on
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    res.end(`${JSON.stringify({ epoch: 'e', seq: 0, heartbeat: true, load: busy })}\n`);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const seen: Array<InstanceLoad | null> = [];
  const opts = { url, apiKey: null, retryMs: 20, stallMs: 5000, onLoad: (l: InstanceLoad | null) => seen.push(l) };
  const feed = new KvEventFeed('d', new RouterIndex(), opts, env);
  feed.start();
  try {
    for (let k = 0; k < 500 && connects < 4; k++) await env.sleep(10);
    assert.ok(connects >= 4, 'the feed kept trying to reconnect');
    assert.deepEqual(seen[0], busy, 'the heartbeat load was reported');
    assert.equal(feed.load, null, `the feed still reports ${JSON.stringify(feed.load)}`);
    assert.equal(seen.at(-1), null, `the member still holds ${JSON.stringify(seen.at(-1))}`);
  } finally {
    await feed.close();
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  }
});
