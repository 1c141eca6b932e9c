/**
 * Proves the tcp frame codec: every valid frame survives encode -> any chunking -> decode; random,
 * truncated and mutated input never throws anything but FrameError (the caller's cue to close the
 * connection), never emits a frame it did not fully receive, and memory held stays bounded. Every
 * length limit accepts exactly its maximum and rejects one more.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import {
  DEFAULT_LIMITS,
  FrameDecoder,
  FrameError,
  encodeDataHeader,
  encodeFrame,
  type ControlFrame,
  type DataHead,
  type FrameLimits,
} from './frame.ts';
import { WIRE_STRIDE, sideOfWire } from '../core/ranges.ts';

type Event = { kind: 'frame'; f: ControlFrame } | { kind: 'data'; head: DataHead; bytes: number[] };

/** Collects events; consecutive pieces of one DATA frame are merged. */
function collector(): { events: Event[]; sink: ConstructorParameters<typeof FrameDecoder>[0] } {
  const events: Event[] = [];
  return {
    events,
    sink: {
      frame: (f) => events.push({ kind: 'frame', f }),
      data: (head, piece, at) => {
        const last = events[events.length - 1];
        if (at > 0) {
          assert.ok(
            last?.kind === 'data' && last.head.reqId === head.reqId && last.bytes.length === at,
            'a continuation piece follows its frame',
          );
          last.bytes.push(...piece);
        } else events.push({ kind: 'data', head: { ...head }, bytes: [...piece] });
      },
    },
  };
}

const hex = (min: number, max: number) =>
  fc.uint8Array({ minLength: min, maxLength: max }).map((b) => Buffer.from(b).toString('hex'));
const str = fc.string({ unit: 'grapheme', maxLength: 40 });
const u32 = fc.integer({ min: 0, max: 0xffff_ffff });
const range = fc.record({ slab: fc.integer({ min: 0, max: 0xffff }), offset: fc.maxSafeNat(), length: u32 });

const controlFrame: fc.Arbitrary<ControlFrame> = fc.oneof(
  fc.record({ type: fc.constant('hello' as const), engineId: str, session: hex(16, 32) }),
  fc.constant({ type: 'helloOk' as const }),
  fc.record({
    type: fc.constantFrom('read' as const, 'write' as const),
    reqId: u32,
    transferId: str,
    grantToken: hex(0, 64),
    ranges: fc.array(range, { maxLength: 12 }).map((rs) => sideOfWire(rs).p),
  }),
  fc.record({ type: fc.constant('done' as const), reqId: u32 }),
  fc.record({ type: fc.constant('error' as const), reqId: u32, code: str, message: str }),
  fc.record({
    type: fc.constant('side' as const),
    body: fc.jsonValue({ maxDepth: 3 }).map((v) => JSON.parse(JSON.stringify(v)) as unknown),
  }),
);

type Item = { control: ControlFrame } | { reqId: number; streamOffset: number; payload: Uint8Array };
const dataItem = fc.record({
  reqId: u32,
  streamOffset: fc.maxSafeNat(),
  payload: fc.uint8Array({ minLength: 1, maxLength: 3000 }),
});
const item: fc.Arbitrary<Item> = fc.oneof(
  controlFrame.map((control) => ({ control })),
  dataItem,
);

function encodeItem(it: Item): Uint8Array {
  if ('control' in it) return encodeFrame(it.control);
  return Buffer.concat([encodeDataHeader(it.reqId, it.streamOffset, it.payload.length), it.payload]);
}

function expected(it: Item): Event {
  if ('control' in it) return { kind: 'frame', f: it.control };
  return {
    kind: 'data',
    head: { reqId: it.reqId, streamOffset: it.streamOffset, length: it.payload.length },
    bytes: [...it.payload],
  };
}

/** Split `bytes` at the given cut points. */
function chunks(bytes: Uint8Array, cuts: number[]): Uint8Array[] {
  const points = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b);
  const out: Uint8Array[] = [];
  let prev = 0;
  for (const p of [...points, bytes.length]) {
    out.push(bytes.subarray(prev, p));
    prev = p;
  }
  return out;
}

/** Feed chunks; returns the FrameError if one was thrown (anything else fails the test). */
function feed(dec: FrameDecoder, parts: Uint8Array[]): FrameError | null {
  for (const p of parts) {
    try {
      dec.push(p);
    } catch (e) {
      assert.ok(e instanceof FrameError, `non-FrameError thrown: ${String(e)}`);
      return e;
    }
  }
  return null;
}

test('frame codec: any sequence of valid frames, cut anywhere, decodes to the same frames and bytes', () => {
  fc.assert(
    fc.property(fc.array(item, { maxLength: 8 }), fc.array(fc.nat(), { maxLength: 20 }), (items, cuts) => {
      const { events, sink } = collector();
      const dec = new FrameDecoder(sink);
      const stream = Buffer.concat(items.map(encodeItem));
      assert.equal(feed(dec, chunks(stream, cuts)), null);
      const plain = (x: unknown): unknown => JSON.parse(JSON.stringify(x));
      assert.deepEqual(plain(events), plain(items.map(expected)));
      assert.ok(dec.idle);
    }),
    { numRuns: 300 },
  );
});

test('frame codec: a truncated stream emits only the whole frames before the cut, never throws', () => {
  fc.assert(
    fc.property(
      fc.array(item, { minLength: 1, maxLength: 6 }),
      fc.nat(),
      fc.array(fc.nat(), { maxLength: 10 }),
      (items, cutAt, cuts) => {
        const encoded = items.map(encodeItem);
        const stream = Buffer.concat(encoded);
        const cut = cutAt % stream.length;
        const { events, sink } = collector();
        const dec = new FrameDecoder(sink);
        assert.equal(feed(dec, chunks(stream.subarray(0, cut), cuts)), null);
        let whole = 0;
        let end = 0;
        for (const e of encoded) {
          if (end + e.length > cut) break;
          end += e.length;
          whole++;
        }
        const controlSeen = events.filter((e) => e.kind === 'frame').length;
        const controlWhole = items.slice(0, whole).filter((i) => 'control' in i).length;
        assert.equal(controlSeen, controlWhole, 'no control frame emitted before all its bytes arrived');
        assert.equal(dec.idle, cut === end);
      },
    ),
    { numRuns: 300 },
  );
});

const small: FrameLimits = { controlBytesMax: 4096, dataBytesMax: 8192, rangesMax: 64, stringBytesMax: 256 };

test('frame codec: random bytes in random chunks only ever raise FrameError, and buffering stays bounded', () => {
  fc.assert(
    fc.property(fc.uint8Array({ maxLength: 6000 }), fc.array(fc.nat(), { maxLength: 20 }), (bytes, cuts) => {
      const dec = new FrameDecoder(collector().sink, small);
      for (const p of chunks(bytes, cuts)) {
        try {
          dec.push(p);
        } catch (e) {
          assert.ok(e instanceof FrameError, `non-FrameError thrown: ${String(e)}`);
          assert.throws(() => dec.push(new Uint8Array([0])), FrameError, 'a failed decoder stays failed');
          return;
        }
        assert.ok(dec.bufferedBytes <= small.controlBytesMax + 17);
      }
    }),
    { numRuns: 500 },
  );
});

test('frame codec: well-framed random bodies of every type reach the body parsers and only raise FrameError', () => {
  const framed = fc
    .record({ type: fc.integer({ min: 0, max: 10 }), body: fc.uint8Array({ maxLength: 200 }) })
    .map(({ type, body }) => {
      const b = Buffer.alloc(5 + body.length);
      b.writeUInt32BE(body.length, 0);
      b[4] = type;
      b.set(body, 5);
      return b;
    });
  let parsed = 0;
  fc.assert(
    fc.property(
      fc.array(framed, { minLength: 1, maxLength: 5 }),
      fc.array(fc.nat(), { maxLength: 8 }),
      (frames, cuts) => {
        const { events, sink } = collector();
        feed(new FrameDecoder(sink, small), chunks(Buffer.concat(frames), cuts));
        parsed += events.length;
      },
    ),
    { numRuns: 1000 },
  );
  assert.ok(parsed > 0, 'some random bodies parse (the generator reaches the parsers)');
});

test('frame codec: valid streams with flipped bytes decode or raise FrameError, nothing else', () => {
  fc.assert(
    fc.property(
      fc.array(item, { minLength: 1, maxLength: 4 }),
      fc.array(fc.tuple(fc.nat(), fc.integer({ min: 1, max: 255 })), { minLength: 1, maxLength: 6 }),
      (items, flips) => {
        const stream = Buffer.concat(items.map(encodeItem));
        for (const [at, x] of flips) stream[at % stream.length] = (stream[at % stream.length] ?? 0) ^ x;
        feed(new FrameDecoder(collector().sink), [stream]);
      },
    ),
    { numRuns: 300 },
  );
});

test('frame codec: each malformed frame kind is a FrameError', () => {
  const header = (len: number, type: number) => {
    const b = Buffer.alloc(5);
    b.writeUInt32BE(len, 0);
    b[4] = type;
    return b;
  };
  const bad: Array<[string, Uint8Array]> = [
    ['unknown type', header(0, 99)],
    ['oversized control frame', header(DEFAULT_LIMITS.controlBytesMax + 1, 8)],
    ['DATA without payload', Buffer.concat([header(12, 5), Buffer.alloc(12)])],
    ['oversized DATA', header(12 + DEFAULT_LIMITS.dataBytesMax + 1, 5)],
    ['trailing bytes', Buffer.concat([header(5, 6), Buffer.alloc(5)])],
    ['truncated body', Buffer.concat([header(2, 6), Buffer.alloc(2)])],
    ['invalid utf-8 string', Buffer.concat([header(6, 1), Buffer.from([0, 2, 0xff, 0xfe, 0, 0])])],
    ['bad JSON', Buffer.concat([header(3, 8), Buffer.from('{x:')])],
    ['range count mismatch', Buffer.concat([header(4 + 2 + 1 + 4, 3), Buffer.from([0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 9])])],
  ];
  for (const [what, bytes] of bad) {
    assert.throws(() => new FrameDecoder(collector().sink).push(bytes), FrameError, what);
  }
});

test('frame codec: DATA payloads reach the sink in pieces without reassembly', () => {
  const payload = new Uint8Array(100_000).map((_, i) => i & 0xff);
  const stream = Buffer.concat([encodeDataHeader(7, 1234, payload.length), payload]);
  const pieces: number[] = [];
  const dec = new FrameDecoder({
    frame: () => assert.fail('no control frame expected'),
    data: (head, piece, at) => {
      assert.equal(head.reqId, 7);
      assert.equal(head.streamOffset, 1234);
      assert.ok(Buffer.from(piece).equals(payload.subarray(at, at + piece.length)));
      pieces.push(piece.length);
    },
  });
  for (let i = 0; i < stream.length; i += 65536) dec.push(stream.subarray(i, i + 65536));
  assert.equal(
    pieces.reduce((a, b) => a + b, 0),
    payload.length,
  );
  assert.ok(pieces.length > 1);
  assert.ok(dec.bufferedBytes === 0 && dec.idle);
});

test('frame codec: payloadInPlace moves past payload bytes a reader placed itself; pieces after it keep their offsets', () => {
  fc.assert(
    fc.property(fc.integer({ min: 1, max: 5000 }), fc.array(fc.nat(5000), { maxLength: 6 }), (len, cuts) => {
      const payload = new Uint8Array(len).map((_, i) => (i * 13) & 0xff);
      const stream = Buffer.concat([encodeDataHeader(9, 77, len), payload, encodeFrame({ type: 'done', reqId: 9 })]);
      const seen = new Uint8Array(len);
      const frames: ControlFrame[] = [];
      const dec = new FrameDecoder({
        frame: (f) => void frames.push(f),
        data: (head, piece, at) => {
          assert.deepEqual([head.reqId, head.streamOffset], [9, 77]);
          seen.set(piece, at);
        },
      });
      dec.push(stream.subarray(0, 17));
      // Alternate: some bytes "placed in place" (copied here by hand), some pushed.
      let at = 0;
      for (const [k, c] of cuts.entries()) {
        const n = Math.min(c, len - at);
        if (n === 0) break;
        if (k % 2 === 0) {
          const p = dec.payloadPending;
          assert.deepEqual([p?.reqId, p?.left, p?.at, p?.head.length], [9, len - at, at, len]);
          const r = dec.payloadInPlace(n);
          assert.deepEqual([r.head.reqId, r.at], [9, at]);
          seen.set(payload.subarray(at, at + n), at);
        } else dec.push(payload.subarray(at, at + n));
        at += n;
      }
      if (at < len) assert.throws(() => dec.payloadInPlace(len - at + 1), /not in this payload/);
      dec.push(stream.subarray(17 + at));
      assert.deepEqual(seen, payload);
      assert.deepEqual(frames, [{ type: 'done', reqId: 9 }]);
      assert.ok(dec.idle);
      assert.throws(() => dec.payloadInPlace(1), /not in this payload/, 'between frames');
    }),
  );
});

// Every length limit of the parser, at its exact boundary: the limit itself is accepted, one more is
// rejected. (An off-by-one in the DATA check passed every test above: they only probe far from it.)

/** Counts DATA payload bytes without holding them (a 16 MiB payload must not become a JS array). */
function counter(): { frames: ControlFrame[]; dataBytes: number; sink: ConstructorParameters<typeof FrameDecoder>[0] } {
  const c = {
    frames: [] as ControlFrame[],
    dataBytes: 0,
    sink: {
      frame: (f: ControlFrame) => void c.frames.push(f),
      data: (_head: DataHead, piece: Uint8Array) => void (c.dataBytes += piece.length),
    },
  };
  return c;
}

test('frame limits: a DATA payload of exactly dataBytesMax (16 MiB, the tcp default) is accepted and streamed; dataBytesMax + 1 is rejected', () => {
  const max = DEFAULT_LIMITS.dataBytesMax;
  assert.equal(max, 16 << 20);
  const ok = counter();
  const dec = new FrameDecoder(ok.sink);
  dec.push(encodeDataHeader(3, 0, max));
  const payload = new Uint8Array(1 << 20);
  for (let i = 0; i < 16; i++) dec.push(payload);
  assert.equal(ok.dataBytes, max);
  assert.ok(dec.idle, 'the whole frame was consumed');
  assert.throws(
    () => new FrameDecoder(counter().sink).push(encodeDataHeader(3, 0, max + 1)),
    (e: unknown) => e instanceof FrameError && /too large/.test(e.message),
  );
  // The lower bound: one payload byte is a frame, zero is not.
  const one = counter();
  new FrameDecoder(one.sink).push(Buffer.concat([encodeDataHeader(3, 0, 1), Buffer.from([7])]));
  assert.equal(one.dataBytes, 1);
});

test('frame limits: a DATA payload of exactly a custom dataBytesMax is accepted; one byte more is rejected', () => {
  const ok = counter();
  new FrameDecoder(ok.sink, small).push(
    Buffer.concat([encodeDataHeader(1, 0, small.dataBytesMax), new Uint8Array(small.dataBytesMax)]),
  );
  assert.equal(ok.dataBytes, small.dataBytesMax);
  assert.throws(
    () => new FrameDecoder(counter().sink, small).push(encodeDataHeader(1, 0, small.dataBytesMax + 1)),
    FrameError,
  );
});

test('frame limits: a control body (side JSON) of exactly controlBytesMax is accepted; controlBytesMax + 1 is rejected', () => {
  const max = DEFAULT_LIMITS.controlBytesMax;
  // JSON of a string of n ASCII letters is n + 2 bytes.
  const atMax = encodeFrame({ type: 'side', body: 'a'.repeat(max - 2) });
  assert.equal(atMax.length, 5 + max);
  const ok = counter();
  new FrameDecoder(ok.sink).push(atMax);
  assert.equal(ok.frames.length, 1);
  assert.equal((ok.frames[0] as { body: string }).body.length, max - 2);
  const over = encodeFrame({ type: 'side', body: 'a'.repeat(max - 1) });
  assert.throws(
    () => new FrameDecoder(counter().sink).push(over),
    (e: unknown) => e instanceof FrameError && /exceeds/.test(e.message),
  );
  // Same boundary for a binary control frame under custom limits.
  const err = (msgBytes: number): Uint8Array =>
    encodeFrame({ type: 'error', reqId: 1, code: '', message: 'm'.repeat(msgBytes) });
  const fits = err(small.stringBytesMax);
  const lim: FrameLimits = { ...small, controlBytesMax: fits.length - 5 };
  new FrameDecoder(counter().sink, lim).push(fits);
  assert.throws(
    () => new FrameDecoder(counter().sink, { ...lim, controlBytesMax: fits.length - 6 }).push(fits),
    FrameError,
  );
});

test('frame limits: a string field of exactly stringBytesMax bytes (counted in utf-8 bytes) is accepted; one byte more is rejected', () => {
  const hello = (engineId: string): Uint8Array => encodeFrame({ type: 'hello', engineId, session: '00'.repeat(16) });
  for (const id of ['x'.repeat(small.stringBytesMax), 'é'.repeat(small.stringBytesMax / 2)]) {
    const ok = counter();
    new FrameDecoder(ok.sink, small).push(hello(id));
    assert.deepEqual(ok.frames, [{ type: 'hello', engineId: id, session: '00'.repeat(16) }]);
  }
  for (const id of ['x'.repeat(small.stringBytesMax + 1), `${'é'.repeat(small.stringBytesMax / 2)}x`]) {
    assert.throws(
      () => new FrameDecoder(counter().sink, small).push(hello(id)),
      (e: unknown) => e instanceof FrameError && /string of 257 bytes/.test(e.message),
    );
  }
});

test('frame limits: exactly rangesMax ranges in a READ/WRITE is accepted; rangesMax + 1 is rejected', () => {
  const rw = (n: number): Uint8Array =>
    encodeFrame({
      type: 'write',
      reqId: 9,
      transferId: 't',
      grantToken: 'ab',
      ranges: sideOfWire(Array.from({ length: n }, (_, i) => ({ slab: i, offset: i * 64, length: 64 }))).p,
    });
  const ok = counter();
  new FrameDecoder(ok.sink, small).push(rw(small.rangesMax));
  assert.equal(ok.frames.length, 1);
  assert.equal((ok.frames[0] as { ranges: Float64Array }).ranges.length, small.rangesMax * WIRE_STRIDE);
  assert.throws(
    () => new FrameDecoder(counter().sink, small).push(rw(small.rangesMax + 1)),
    (e: unknown) => e instanceof FrameError && /ranges exceed/.test(e.message),
  );
});

test('frame limits: u64 fields (range offset, DATA stream offset) accept 2^53 - 1 and reject 2^53', () => {
  const top = Number.MAX_SAFE_INTEGER;
  const set2p53 = (b: Uint8Array, at: number): Uint8Array => {
    const out = Buffer.from(b);
    out.writeUInt32BE(1 << 21, at);
    out.writeUInt32BE(0, at + 4);
    return out;
  };
  // read frame: header 5 | reqId 4 | str '' 2 | bytes8 '' 1 | n 4 | slab 2 | offset 8 | length 4
  const read = encodeFrame({
    type: 'read',
    reqId: 1,
    transferId: '',
    grantToken: '',
    ranges: new Float64Array([0, top, 1]),
  });
  const ok = counter();
  new FrameDecoder(ok.sink).push(read);
  assert.equal((ok.frames[0] as { ranges: Float64Array }).ranges[1], top);
  assert.throws(
    () => new FrameDecoder(counter().sink).push(set2p53(read, 18)),
    (e: unknown) => e instanceof FrameError && /beyond 2\^53/.test(e.message),
  );
  // DATA: header 5 | reqId 4 | streamOffset 8
  const data = Buffer.concat([encodeDataHeader(1, top, 1), Buffer.from([1])]);
  const heads: DataHead[] = [];
  new FrameDecoder({ frame: () => assert.fail('no control frame'), data: (h) => void heads.push({ ...h }) }).push(data);
  assert.deepEqual(heads, [{ reqId: 1, streamOffset: top, length: 1 }]);
  assert.throws(
    () => new FrameDecoder(counter().sink).push(set2p53(data, 9)),
    (e: unknown) => e instanceof FrameError && /beyond 2\^53/.test(e.message),
  );
});
