/**
 * The KV event feed's subscriber bound must not lock a router out: 16 clients that open
 * `/handoff/kv_events` and never read (idle, or gone quiet) held every slot, and a kv-aware proxy that
 * connected after them got 503 OVERLOADED on every retry; a non-reading subscriber is cut only once
 * 8 MiB of heartbeats piled up behind it (hours at one heartbeat every 250 ms). A new subscriber now takes
 * the slot of the one furthest behind (the oldest when none is): the router gets its feed at once, and
 * an evicted legitimate subscriber reconnects with `since`, as after any cut.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance, type Instance } from './instance.ts';
import { KV_EVENT_SUBSCRIBERS_MAX } from './kv_event_stream.ts';

const env = new RealEnv(41);
let inst: Instance;

before(async () => {
  inst = await startInstance(
    { ...DEFAULT_INSTANCE_OPTIONS, port: 0, device: 'sim', numBlocks: 64, scheduler: { maxModelLen: 128 } },
    env,
  );
});

after(async () => {
  await inst.close();
});

test('16 idle subscribers do not lock a router out of the KV event feed', async () => {
  const idle: AbortController[] = [];
  const idleBodies: Array<ReadableStreamDefaultReader<Uint8Array>> = [];
  try {
    for (let i = 0; i < KV_EVENT_SUBSCRIBERS_MAX; i++) {
      const ac = new AbortController();
      idle.push(ac);
      const r = await fetch(`${inst.url}/handoff/kv_events`, { signal: ac.signal });
      assert.equal(r.status, 200);
      idleBodies.push(r.body!.getReader()); // never read
    }
    const router = new AbortController();
    const timer = env.setTimer(10_000, () => router.abort());
    try {
      const r = await fetch(`${inst.url}/handoff/kv_events?since=0`, { signal: router.signal });
      assert.equal(
        r.status,
        200,
        `the router was refused the feed: ${r.status} ${r.status === 200 ? '' : await r.text()}`,
      );
      const first = await r.body!.getReader().read();
      const line = JSON.parse(new TextDecoder().decode(first.value).split('\n')[0]!) as { heartbeat?: boolean };
      assert.equal(line.heartbeat, true, 'the router gets the feed');
    } finally {
      timer.cancel();
      router.abort();
    }
    // The slot came from the oldest idle subscriber: its stream was ended.
    const evicted = await Promise.race([
      (async () => {
        for (;;) if ((await idleBodies[0]!.read()).done) return true;
      })().catch(() => true),
      env.sleep(5_000).then(() => false),
    ]);
    assert.ok(evicted, 'the oldest idle subscriber was cut to make room');
  } finally {
    for (const ac of idle) ac.abort();
  }
});
