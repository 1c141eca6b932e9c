/**
 * tcp: a peer that hangs with work in flight (a stopped prefill process, a host gone without a FIN) fails
 * that work after the silence bound, with no abort from the requester; a slow link that keeps moving is
 * not taken for a hung peer.
 *
 * Before the fix a READ to a hung peer completed only when the transfer engine's timeout aborted it (30 s
 * by default): decode's step awaited it, and every other request of that decode froze as long (measured
 * end to end: a stream through another prefill stopped for 30,008 ms when one prefill was SIGSTOPped after
 * answering). The first two tests failed with "the READ is still pending".
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { TcpPlane } from './nic_tcp.ts';
import type { ErrorCode } from '../../util/errors.ts';
import { PEER_SESSION, planeContext, relay, sleep, workRequest, type RelayFault } from './relay_testkit.ts';

const SILENT_MS = 300;

async function withRelay(
  fault: RelayFault,
  body: (client: TcpPlane, done: Map<number, ErrorCode | null>) => Promise<void>,
): Promise<void> {
  const done = new Map<number, ErrorCode | null>();
  const server = new TcpPlane(planeContext('P', new Map()), '127.0.0.1', 0);
  const port = await server.listen();
  const client = new TcpPlane(planeContext('D', done, { silentPeerMs: SILENT_MS }), '127.0.0.1', 0);
  await client.listen();
  const r = await relay(port, fault);
  client.setPeer('P', { host: '127.0.0.1', port: (r.address() as net.AddressInfo).port, session: PEER_SESSION });
  try {
    await body(client, done);
  } finally {
    r.close();
    await Promise.all([client.close(), server.close()]);
  }
}

async function settled(
  done: Map<number, ErrorCode | null>,
  wrId: number,
  withinMs: number,
  what = 'READ',
): Promise<number> {
  const t0 = performance.now();
  while (!done.has(wrId) && performance.now() - t0 < withinMs) await sleep(10);
  assert.ok(done.has(wrId), `the ${what} is still pending after ${withinMs} ms`);
  return performance.now() - t0;
}

test('a READ whose peer goes silent (nothing comes back after the hello) fails PEER_UNAVAILABLE after the bound, unaborted', async () => {
  await withRelay({ dir: 'down', stallAfter: 5 }, async (client, done) => {
    client.post(workRequest(1, 'read', 1));
    const ms = await settled(done, 1, 20 * SILENT_MS);
    assert.equal(done.get(1), 'PEER_UNAVAILABLE');
    assert.ok(ms >= SILENT_MS * 0.9, `failed after ${ms.toFixed(0)} ms, before the silence bound`);
    // The next READ opens a fresh connection and completes.
    client.post(workRequest(2, 'read', 1));
    await settled(done, 2, 20 * SILENT_MS);
    assert.equal(done.get(2), null);
  });
});

test('a WRITE whose peer stops reading mid-payload fails PEER_UNAVAILABLE after the bound, unaborted', async () => {
  await withRelay({ dir: 'up', stallAfter: 64 * 1024 }, async (client, done) => {
    client.post(workRequest(1, 'write', 8));
    await settled(done, 1, 20 * SILENT_MS, 'WRITE');
    assert.equal(done.get(1), 'PEER_UNAVAILABLE');
  });
});

test('a READ over a slow link that keeps moving (64 KiB per 50 ms, 2.7x the silence bound in all) completes', async () => {
  await withRelay({ dir: 'down', bytesPer50Ms: 64 * 1024 }, async (client, done) => {
    client.post(workRequest(1, 'read', 1));
    const ms = await settled(done, 1, 30_000);
    assert.equal(done.get(1), null, `the slow READ failed: ${String(done.get(1))}`);
    assert.ok(ms > SILENT_MS, `the link was not slow (${ms.toFixed(0)} ms)`);
  });
});
