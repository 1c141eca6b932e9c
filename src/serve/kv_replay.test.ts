/**
 * Proves: a router whose KV event feed fell further behind than the stream's backlog bound (8 MiB of
 * events: a feed that broke during a burst of long prompts) catches up on its next connection. Before,
 * the instance wrote the whole `since` replay at once, so the replay itself passed the backlog bound and
 * the stream was cut before its heartbeat, on every reconnect: the router never learned it was behind
 * (no dump), and each reconnect cost the instance megabytes of JSON on its event loop. Now a replay over
 * the bound is not sent: the heartbeat ahead of the router asks for a dump, and one connection does.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { KvEventPublisher } from '../kv/kv_events.ts';
import { KvEventStreams } from './kv_event_stream.ts';
import { KvEventFeed } from './kv_event_feed.ts';
import { RouterIndex } from './router_index.ts';

const env = new RealEnv(53);
const hash = (s: string): string => createHash('sha256').update(s).digest('hex');

test('a feed more than the backlog bound behind catches up on one connection (dump), not cut on every replay', async () => {
  let cached: string[] = [];
  const pub = new KvEventPublisher({ epoch: '1-p', wallMs: () => env.wallMs(), snapshot: () => [...cached] });
  // 200 batches of ~70 KB each (14 MB of events), each storing 1,000 hashes and removing the previous ones.
  for (let k = 0; k < 200; k++) {
    const stored = Array.from({ length: 1000 }, (_, i) => hash(`${k}:${i}`));
    if (cached.length > 0) pub.emit({ type: 'BlockRemoved', block_hashes: cached, medium: 'GPU' });
    pub.emit({
      type: 'BlockStored',
      block_hashes: stored,
      parent_block_hash: null,
      token_ids: [],
      block_size: 16,
      lora_id: null,
      medium: 'GPU',
      group_idx: 0,
    });
    cached = stored;
    pub.flush();
  }
  const load = { running: 0, waiting: 0, held_for_send: 0, held_for_send_pages: 0, free_pages: 1, total_pages: 1 };
  const streams = new KvEventStreams(pub, () => load, env, 100);
  const server = createServer((req, res) => {
    const path = (req.url ?? '').split('?')[0];
    if (path === '/handoff/kv_events') return streams.stream(req, res);
    if (path === '/handoff/kv_events/dump') return streams.dump(res);
    res.writeHead(404).end();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const index = new RouterIndex();
  const feed = new KvEventFeed(url, index, { url, apiKey: null, retryMs: 200, stallMs: 5000 }, env);
  feed.start();
  try {
    const deadline = env.nowMs() + 15_000;
    while (index.position(url).seq < pub.seq && env.nowMs() < deadline) await env.sleep(50);
    assert.equal(
      index.position(url).seq,
      pub.seq,
      `the router caught up (connects ${feed.stats.connects}, lines ${feed.stats.lines})`,
    );
    assert.deepEqual([...index.hashesOf(url)].sort(), [...cached].sort(), 'its set equals the instance set');
    assert.equal(feed.stats.connects, 1, 'on its first connection (the stream was not cut by its own replay)');
  } finally {
    await feed.close();
    streams.closeAll();
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  }
});
