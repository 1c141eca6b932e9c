/**
 * Proves the native scatter receive (native/scatter_read.c): it is built (unless HANDOFF_NATIVE=off says
 * it is meant not to be), readv puts a socket's bytes into the given segments in order and nothing else,
 * returns 0 when nothing is there to read, and refuses a segment outside its slab or malformed arguments
 * before the kernel sees them.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { SCATTER_SEGS_MAX, scatterNative, scatterNativeStatus, socketFd } from './scatter_native.ts';

const off = process.env.HANDOFF_NATIVE === 'off';

test('native addon: built by npm ci (scripts/build_native.mjs) unless HANDOFF_NATIVE=off', () => {
  if (off) return assert.equal(scatterNative(), null);
  assert.ok(
    scatterNative() !== null,
    `native addon not loaded: ${scatterNativeStatus()} (run: node scripts/build_native.mjs)`,
  );
});

/** A connected pair whose server side libuv never reads (paused on connect): only readv takes its bytes. */
async function pair(): Promise<{ client: net.Socket; fd: number; close: () => Promise<void> }> {
  let accepted: net.Socket | null = null;
  const server = net.createServer({ pauseOnConnect: true }, (s) => (accepted = s));
  const port = await new Promise<number>((r) =>
    server.listen(0, '127.0.0.1', () => r((server.address() as net.AddressInfo).port)),
  );
  const client = net.connect(port, '127.0.0.1');
  await new Promise((r) => client.once('connect', r));
  while (accepted === null) await new Promise((r) => setTimeout(r, 2));
  const s = accepted as net.Socket;
  return {
    client,
    fd: socketFd(s),
    close: async () => {
      client.destroy();
      s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
}

test(
  'scatterRead: bytes land in the segments in order, nothing else is written; 0 when nothing waits',
  { skip: off },
  async () => {
    const native = scatterNative();
    assert.ok(native !== null);
    const { client, fd, close } = await pair();
    try {
      assert.ok(fd >= 0, 'a TCP socket has a descriptor');
      const slabs = [new Uint8Array(new SharedArrayBuffer(4096)).fill(0xee), new Uint8Array(4096).fill(0xee)];
      // Three segments: slab 1 at 100 (5 bytes), slab 0 at 4000 (96 bytes), slab 0 at 0 (10 bytes).
      const segs = Float64Array.from([1, 100, 5, 0, 4000, 96, 0, 0, 10]);
      assert.equal(native.scatterRead(fd, slabs, segs, 3), 0, 'nothing sent yet: 0, no block');
      const sent = Uint8Array.from({ length: 111 }, (_, i) => i + 1);
      client.write(sent);
      let got = 0;
      const deadline = Date.now() + 5000;
      while (got === 0 && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 5));
        got = native.scatterRead(fd, slabs, segs, 3);
      }
      assert.equal(got, 111);
      assert.deepEqual([...(slabs[1] as Uint8Array).subarray(100, 105)], [...sent.subarray(0, 5)]);
      assert.deepEqual([...(slabs[0] as Uint8Array).subarray(4000, 4096)], [...sent.subarray(5, 101)]);
      assert.deepEqual([...(slabs[0] as Uint8Array).subarray(0, 10)], [...sent.subarray(101, 111)]);
      const touched = (slab: number, i: number): boolean => (slab === 1 ? i >= 100 && i < 105 : i >= 4000 || i < 10);
      slabs.forEach((s, k) =>
        s.forEach((b, i) => touched(k, i) || assert.equal(b, 0xee, `slab ${k} byte ${i} written`)),
      );
    } finally {
      await close();
    }
  },
);

test('scatterRead: a segment outside its slab or bad arguments throw before any read', { skip: off }, async () => {
  const native = scatterNative();
  assert.ok(native !== null);
  const { client, fd, close } = await pair();
  try {
    client.write(Buffer.alloc(64, 7));
    await new Promise((r) => setTimeout(r, 50));
    const slabs = [new Uint8Array(128)];
    const bad: Array<[Float64Array, number, RegExp]> = [
      [Float64Array.from([0, 100, 29]), 1, /outside its slab/],
      [Float64Array.from([0, -1, 4]), 1, /outside its slab/],
      [Float64Array.from([0, 0, 0]), 1, /outside its slab/],
      [Float64Array.from([0, 0.5, 4]), 1, /outside its slab/],
      [Float64Array.from([1, 0, 4]), 1, /bad slab/],
      [Float64Array.from([0, 0, 4]), 2, /count triples/],
      [Float64Array.from([0, 0, 4]), 0, /count must be/],
      [new Float64Array(3 * (SCATTER_SEGS_MAX + 1)), SCATTER_SEGS_MAX + 1, /count must be/],
    ];
    for (const [segs, count, msg] of bad) assert.throws(() => native.scatterRead(fd, slabs, segs, count), msg);
    assert.throws(() => native.scatterRead(-1, slabs, Float64Array.from([0, 0, 4]), 1), /bad fd/);
    assert.throws(
      () => native.scatterRead(fd, [new Uint16Array(8) as unknown as Uint8Array], Float64Array.from([0, 0, 4]), 1),
      /Uint8Arrays/,
    );
    // None of them read: all 64 bytes are still there.
    assert.equal(native.scatterRead(fd, slabs, Float64Array.from([0, 0, 128]), 1), 64);
  } finally {
    await close();
  }
});
