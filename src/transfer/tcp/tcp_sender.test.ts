/**
 * Sender.drained (tcp_sender.ts), over a real loopback socket pair: it settles only once the kernel took
 * every byte of the transfer's queued streams, since until then Node holds views of the slab. Proves: with
 * the peer not reading, a 24 MiB reply stays queued and drained() stays pending; once the peer reads it
 * settles; a 7 MiB reply written to the socket in full is not drained while Node still holds part of it;
 * a transfer with nothing queued settles at once; a destroyed socket settles it too.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { once } from 'node:events';
import { Sender } from './tcp_sender.ts';
import { packRanges, sideOf } from '../core/ranges.ts';

async function socketPair(): Promise<{ a: net.Socket; b: net.Socket; close: () => void }> {
  const server = net.createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as net.AddressInfo;
  const accepted = once(server, 'connection');
  const a = net.connect(port, '127.0.0.1');
  await once(a, 'connect');
  const [b] = (await accepted) as [net.Socket];
  return { a, b, close: () => (a.destroy(), b.destroy(), server.close()) };
}

const settledWithin = async (p: Promise<void>, ms: number): Promise<boolean> =>
  Promise.race([p.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), ms))]);

const MiB = 1 << 20;

function rangesOf(bytes: number): ReturnType<typeof sideOf> {
  return sideOf(packRanges([{ slab: 0, localOffset: 0, remoteOffset: 0, length: bytes }]), 'local');
}

test('drained: pending while the peer does not read the queued reply, settled once it did', async () => {
  const { a, b, close } = await socketPair();
  try {
    b.pause(); // the peer stops reading: kernel buffers fill, Node keeps the rest as views of the slab
    const slab = new Uint8Array(32 * MiB);
    const sender = new Sender(a, [slab], 4 * MiB);
    sender.enqueue(1, 'T', rangesOf(24 * MiB), () => {});
    assert.equal(await settledWithin(sender.drained('other'), 200), true, 'a transfer with nothing queued: at once');
    const drained = sender.drained('T');
    assert.equal(await settledWithin(drained, 300), false, 'bytes of T still wait in Node: not drained');
    let got = 0;
    b.on('data', (c: Buffer) => (got += c.length));
    b.resume();
    assert.equal(await settledWithin(drained, 10_000), true, 'drained once the peer read');
    assert.ok(got > 0);
  } finally {
    close();
  }
});

test('drained: a stream handed to the socket in full is not drained while Node still holds its bytes', async () => {
  const { a, b, close } = await socketPair();
  try {
    b.pause();
    const sender = new Sender(a, [new Uint8Array(8 * MiB)], 4 * MiB);
    let sent = false;
    sender.enqueue(1, 'T', rangesOf(7 * MiB), () => (sent = true)); // under SEND_HIGH_WATER: written at once
    await new Promise((r) => setTimeout(r, 100));
    assert.ok(sent && !sender.has(1), 'every frame was handed to the socket');
    assert.ok(a.writableLength > 0, 'the kernel took only part: Node holds views of the rest');
    const drained = sender.drained('T');
    assert.equal(await settledWithin(drained, 300), false, 'not drained while those views wait');
    b.resume();
    assert.equal(await settledWithin(drained, 10_000), true);
  } finally {
    close();
  }
});

test('drained: a destroyed socket settles it (nothing will read the views any more)', async () => {
  const { a, b, close } = await socketPair();
  try {
    b.pause();
    const sender = new Sender(a, [new Uint8Array(32 * MiB)], 4 * MiB);
    sender.enqueue(1, 'T', rangesOf(24 * MiB), () => {});
    const drained = sender.drained('T');
    assert.equal(await settledWithin(drained, 200), false);
    a.destroy();
    assert.equal(await settledWithin(drained, 5_000), true);
  } finally {
    close();
  }
});
