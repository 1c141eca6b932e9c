/**
 * Proves: a client of GET /handoff/kv_events/dump that takes none of the answer (gone quiet, partitioned,
 * or hostile) is dropped after the instance's client stall bound, like a completion's answer. Before,
 * the dump (up to ~70 MB of JSON for a 1 Mi-block cache) was handed to the socket with no bound at all:
 * what the kernel did not take stayed queued in the instance's memory for as long as the client kept
 * the connection open (forever: the server has no socket timeout), a fresh copy per such request.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { RealEnv } from '../util/env.ts';
import { LOOPBACK_PEERS } from '../connector/peer_directory.ts';
import { InstanceServer, type ServedEngine } from './instance_server.ts';

const env = new RealEnv(16);
const H = (i: number): string => i.toString(16).padStart(64, '0');

test('a dump whose client reads nothing is dropped after the client stall bound', async () => {
  const hashes = Array.from({ length: 300_000 }, (_, i) => H(i + 1)); // ~20 MB of JSON: more than the socket buffers
  const bodyBytes = Buffer.byteLength(JSON.stringify({ epoch: 'e', seq: 1, block_hashes: hashes }));
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
  const port = await server.listen(0, '127.0.0.1');
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
