/**
 * Proves: a client of GET /handoff/kv_events/dump that takes none of the answer (gone quiet, partitioned,
 * or hostile) is dropped after the instance's client stall bound, like a completion's answer. Before,
 * the dump (up to ~70 MB of JSON for a 1 Mi-block cache) was handed to the socket with no bound at all:
 * what the kernel did not take stayed queued in the instance's memory for as long as the client kept
 * the connection open (forever: the server has no socket timeout), a fresh copy per such request.
 * And (session 19): the dump is written a slice at a time, so the instance's event loop (its engine steps)
 * keeps turning while a large one is answered; at most four are answered at once, a fifth is refused 503.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { performance, PerformanceObserver } from 'node:perf_hooks';
import { RealEnv } from '../util/env.ts';
import { LOOPBACK_PEERS } from '../connector/peer_directory.ts';
import { InstanceServer, type ServedEngine } from './instance_server.ts';

const env = new RealEnv(16);
const H = (i: number): string => i.toString(16).padStart(64, '0');

const hashes = Array.from({ length: 300_000 }, (_, i) => H(i + 1)); // ~20 MB of JSON: more than the socket buffers
const bodyBytes = Buffer.byteLength(JSON.stringify({ epoch: 'e', seq: 1, block_hashes: hashes }));

/** An instance server over an engine whose only state is a KV event source of 300 k hashes. */
async function dumpServer(): Promise<{ server: InstanceServer; port: number }> {
  const engine: ServedEngine = {
    submit: () => ({}),
    abort: () => {},
    cancel: () => {},
    crashed: null,
    releaseUnused: () => false,
    kvEvents: {
      epoch: 'e',
      seq: 1,
      since: () => [],
      dump: () => ({ epoch: 'e', seq: 1, block_hashes: hashes }),
      flush: () => null,
      subscribe: () => () => {},
    },
    load: () => ({ running: 0, waiting: 0, held_for_send: 0, held_for_send_pages: 0, free_pages: 1, total_pages: 1 }),
    resetPrefixCache: () => true,
  } as unknown as ServedEngine;
  const server = new InstanceServer(
    engine,
    {
      modelName: 'm',
      apiKey: null,
      maxModelLen: 64,
      info: {
        engine_id: null,
        role: 'both',
        model: 'm',
        preset: 'dsv4-mini',
        kv_role: null,
        transfer_mode: null,
        side_channel_host: null,
        side_channel_port: null,
        data_port: null,
        max_model_len: 64,
        num_pages: 1,
        block_size: 16,
        prefix_cache_groups: [0],
        kv_events_epoch: 'e',
      },
      prefillerPeers: LOOPBACK_PEERS,
      clientStallMs: 300,
    },
    env,
    () => ({}) as never,
  );
  return { server, port: await server.listen(0, '127.0.0.1') };
}

test('a dump whose client reads nothing is dropped after the client stall bound', async () => {
  const { server, port } = await dumpServer();
  const sock = connect(port, '127.0.0.1');
  try {
    await new Promise<void>((r) => sock.once('connect', () => r()));
    sock.write('GET /handoff/kv_events/dump HTTP/1.1\r\nHost: x\r\n\r\n');
    sock.pause(); // reads nothing
    await env.sleep(1500); // five times the stall bound
    // Now take whatever is there: the whole dump means the instance kept it queued for the silent client.
    let received = 0;
    const ended = new Promise<void>((r) => {
      sock.on('data', (b: Buffer) => {
        received += b.length;
        if (received >= bodyBytes) r();
      });
      sock.once('close', () => r());
    });
    sock.resume();
    await Promise.race([ended, env.sleep(5000)]);
    assert.ok(
      received < bodyBytes,
      `the instance still held the whole ${bodyBytes}-byte dump for a client that read nothing for 1.5 s (got ${received})`,
    );
  } finally {
    sock.destroy();
    await server.close();
  }
});

test('a dump of 300 k hashes is written in slices: the event loop turns while it is answered', async () => {
  const { server, port } = await dumpServer();
  // The baseline, in the same run: the body made in one go and handed to the socket as one buffer, as the
  // instance did before (the better of two tries).
  const once = (): number => {
    const t = performance.now();
    Buffer.from(JSON.stringify({ epoch: 'e', seq: 1, block_hashes: hashes }));
    return performance.now() - t;
  };
  const baselineMs = Math.min(once(), once());
  // The loop's turns, and the garbage collector's pauses (not the code's doing: the test's own 300 k
  // strings make them long), which are taken out of the gaps between turns.
  const turns: number[] = [];
  const pauses: Array<{ at: number; ms: number }> = [];
  const gc = new PerformanceObserver((l) =>
    l.getEntries().forEach((e) => pauses.push({ at: e.startTime, ms: e.duration })),
  );
  gc.observe({ entryTypes: ['gc'] });
  let ticking = true;
  const tick = (): void => {
    turns.push(performance.now());
    if (ticking) setImmediate(tick);
  };
  try {
    setImmediate(tick);
    // A client that only counts what it is sent (in this process too: it must not hold the loop itself).
    const sock = connect(port, '127.0.0.1');
    let received = 0;
    let tail = '';
    const answered = new Promise<void>((resolve) => {
      sock.on('data', (b: Buffer) => {
        received += b.length;
        tail = (tail + b.subarray(-5).toString('latin1')).slice(-5);
        if (tail === '0\r\n\r\n' || tail.endsWith(']}')) resolve(); // a chunked answer's end, or a sized one's
      });
      sock.write('GET /handoff/kv_events/dump HTTP/1.1\r\nHost: x\r\n\r\n');
    });
    await Promise.race([answered, env.sleep(30_000)]);
    ticking = false;
    sock.destroy();
    await env.sleep(50); // the observer's last entries
    gc.disconnect();
    let maxGapMs = 0;
    for (let i = 1; i < turns.length; i++) {
      const [from, to] = [turns[i - 1] as number, turns[i] as number];
      const inGc = pauses.filter((p) => p.at >= from && p.at < to).reduce((n, p) => n + p.ms, 0);
      maxGapMs = Math.max(maxGapMs, to - from - inGc);
    }
    assert.ok(received > bodyBytes, `${received} bytes`);
    // What it was sent, read by an HTTP client now that nothing is timed.
    const r = await fetch(`http://127.0.0.1:${port}/handoff/kv_events/dump`);
    assert.equal(r.status, 200);
    const body = (await r.json()) as { epoch: string; seq: number; block_hashes: string[] };
    assert.deepEqual([body.epoch, body.seq, body.block_hashes.length], ['e', 1, hashes.length]);
    assert.ok(body.block_hashes.every((h, i) => h === hashes[i]));
    assert.ok(
      maxGapMs < baselineMs / 2,
      `the loop waited up to ${maxGapMs.toFixed(0)} ms between turns (GC pauses aside); the dump made in one go takes ${baselineMs.toFixed(0)} ms`,
    );
  } finally {
    ticking = false;
    gc.disconnect();
    await server.close();
  }
});

test('four dumps answered at once at most: a fifth is refused 503 OVERLOADED, the four complete', async () => {
  const { server, port } = await dumpServer();
  const socks = Array.from({ length: 4 }, () => connect(port, '127.0.0.1'));
  try {
    for (const s of socks) {
      s.write('GET /handoff/kv_events/dump HTTP/1.1\r\nHost: x\r\n\r\n');
      s.pause(); // slow clients: their dumps stay in flight
    }
    await env.sleep(100);
    const r = await fetch(`http://127.0.0.1:${port}/handoff/kv_events/dump`);
    assert.equal(r.status, 503);
    assert.equal(((await r.json()) as { error: { code: string } }).error.code, 'OVERLOADED');
    // Readers again: each gets its whole dump, and the slots come back.
    const sizes = await Promise.all(
      socks.map(
        (s) =>
          new Promise<number>((resolve) => {
            let n = 0;
            s.on('data', (b: Buffer) => {
              n += b.length;
              if (b.includes(']}')) resolve(n);
            });
            s.resume();
          }),
      ),
    );
    for (const n of sizes) assert.ok(n > bodyBytes, `${n} bytes`);
    const again = await fetch(`http://127.0.0.1:${port}/handoff/kv_events/dump`);
    assert.equal(again.status, 200);
    await again.arrayBuffer();
  } finally {
    for (const s of socks) s.destroy();
    await server.close();
  }
});
