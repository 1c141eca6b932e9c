/**
 * tcp: a peer that hangs with work in flight (a stopped prefill process, a host gone without a FIN) fails
 * that work after the silence bound, with no abort from the requester; a slow link that keeps moving is
 * not taken for a hung peer.
 *
 * Before the fix a READ to a hung peer completed only when the transfer engine's timeout aborted it (30 s
 * by default): decode's step awaited it, and every other request of that decode froze as long (measured
 * end to end: a stream through another prefill stopped for 30,008 ms when one prefill was SIGSTOPped after
 * answering). The first two tests failed with "the READ is still pending".
 *
 * A peer that stays hung: every later READ to it waited out the bound again on a fresh connection (end to
 * end, three decode legs naming a SIGSTOPped prefill, 3 s apart, stopped a stream through another prefill
 * for 2.5 s each). They now fail at once until the peer answers a hello (the probe) or a handshake
 * re-registers it; the second test failed on the old code ("READ 2 took 3xx ms").
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
    // The relay's next connection passes: the probe is answered, and a READ completes on it.
    const ok = await readUntilLanded(client, done, 2, 20 * SILENT_MS);
    assert.ok(ok !== null, 'no READ completed once the peer answered again');
  });
});

/** Post READs from `wrId` on until one lands (its id) or `withinMs` passed (null); each failure must come at once. */
async function readUntilLanded(
  client: TcpPlane,
  done: Map<number, ErrorCode | null>,
  wrId: number,
  withinMs: number,
): Promise<number | null> {
  const t0 = performance.now();
  for (let id = wrId; performance.now() - t0 < withinMs; id++) {
    client.post(workRequest(id, 'read', 1));
    const ms = await settled(done, id, withinMs);
    if (done.get(id) === null) return id;
    assert.equal(done.get(id), 'PEER_UNAVAILABLE');
    assert.ok(ms < SILENT_MS / 2, `READ ${id} failed after ${ms.toFixed(0)} ms, not at once`);
    await sleep(20);
  }
  return null;
}

/** A peer process that can be stopped and continued: while frozen it accepts connections and never reads them. */
async function freezer(target: number): Promise<{ server: net.Server; thaw: () => void }> {
  let frozen = true;
  const held: net.Socket[] = [];
  const pipe = (client: net.Socket): void => {
    const upstream = net.connect({ host: '127.0.0.1', port: target });
    for (const s of [client, upstream]) s.on('error', () => {});
    client.pipe(upstream).pipe(client);
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
    client.resume();
  };
  const server = net.createServer((client) => {
    if (!frozen) return pipe(client);
    client.on('error', () => {});
    client.pause();
    held.push(client);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const thaw = (): void => {
    frozen = false;
    for (const c of held.splice(0)) if (!c.destroyed) pipe(c);
  };
  return { server, thaw };
}

test('a peer that stays hung: later READs fail at once (no new wait), until it answers a hello again', async () => {
  const done = new Map<number, ErrorCode | null>();
  const server = new TcpPlane(planeContext('P', new Map()), '127.0.0.1', 0);
  const port = await server.listen();
  const client = new TcpPlane(planeContext('D', done, { silentPeerMs: SILENT_MS }), '127.0.0.1', 0);
  await client.listen();
  const f = await freezer(port);
  const peer = { host: '127.0.0.1', port: (f.server.address() as net.AddressInfo).port, session: PEER_SESSION };
  client.setPeer('P', peer);
  try {
    client.post(workRequest(1, 'read', 1));
    const first = await settled(done, 1, 20 * SILENT_MS);
    assert.equal(done.get(1), 'PEER_UNAVAILABLE');
    assert.ok(first >= SILENT_MS * 0.9, `the first READ failed after ${first.toFixed(0)} ms, before the bound`);
    for (const id of [2, 3, 4]) {
      client.post(workRequest(id, 'read', 1));
      const ms = await settled(done, id, 20 * SILENT_MS);
      assert.equal(done.get(id), 'PEER_UNAVAILABLE');
      assert.ok(ms < SILENT_MS / 2, `READ ${id} took ${ms.toFixed(0)} ms: it waited on the hung peer again`);
    }
    // A handshake that goes through re-registers the peer: it is tried again (and here waits out the bound).
    client.setPeer('P', peer);
    client.post(workRequest(5, 'read', 1));
    const again = await settled(done, 5, 20 * SILENT_MS);
    assert.ok(again >= SILENT_MS * 0.9, `after a handshake the READ was refused at once (${again.toFixed(0)} ms)`);
    // The process continues: the probe's hello is answered, and READs land again.
    f.thaw();
    const ok = await readUntilLanded(client, done, 6, 5000);
    assert.ok(ok !== null, 'no READ completed after the peer came back');
  } finally {
    f.server.close();
    await Promise.all([client.close(), server.close()]);
  }
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
