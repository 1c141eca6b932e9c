/**
 * The tcp wire protocol: length-prefixed frames with a type byte. One codec for the data plane (NIC
 * threads) and the side channel (engine threads).
 *
 *   frame  = | bodyLength u32 BE | type u8 | body (bodyLength bytes) |
 *   hello  = | engineId str | session bytes8 |                      client -> server, first frame
 *   helloOk= (empty)
 *   read   = | reqId u32 | transferId str | grantToken bytes8 | n u32 | n x (slab u16, offset u64, length u32) |
 *            (ranges travel packed: a Float64Array of [slab, offset, length] * n, ranges.ts WIRE_STRIDE)
 *   write  = same as read; the DATA frames of the WRITE follow on the same connection
 *   data   = | reqId u32 | streamOffset u64 | payload ... |          bytes of a READ reply or a WRITE
 *   done   = | reqId u32 |                                          WRITE landed in the destination
 *   error  = | reqId u32 | code str | message str |
 *   side   = | JSON utf8 |                                          side channel (handshake, notify)
 *   str    = | length u16 | utf8 |      bytes8 = | length u8 | bytes |      u64 = | hi u32 | lo u32 |
 *
 * DATA payloads stream to the sink as they arrive (no reassembly: one copy, socket buffer -> slab).
 * Anything malformed throws FrameError and the owner closes the connection. Sizes bounded by FrameLimits.
 */
import { assert } from '../../util/assert.ts';
import { WIRE_STRIDE } from '../core/ranges.ts';

export const FRAME_HEADER_BYTES = 5;
export const DATA_HEAD_BYTES = 12;
const RANGE_BYTES = 14;

const TYPE = { hello: 1, helloOk: 2, read: 3, write: 4, data: 5, done: 6, error: 7, side: 8 } as const;

export type ControlFrame =
  | { type: 'hello'; engineId: string; session: string }
  | { type: 'helloOk' }
  | { type: 'read' | 'write'; reqId: number; transferId: string; grantToken: string; ranges: Float64Array }
  | { type: 'done'; reqId: number }
  | { type: 'error'; reqId: number; code: string; message: string }
  | { type: 'side'; body: unknown };

export interface DataHead {
  reqId: number;
  streamOffset: number;
  /** Payload bytes of the whole frame. */
  length: number;
}

export interface FrameSink {
  frame(f: ControlFrame): void;
  /** A piece of a DATA frame's payload, `pieceOffset` bytes into it. Pieces arrive in order. */
  data(head: DataHead, piece: Uint8Array, pieceOffset: number): void;
}

export interface FrameLimits {
  controlBytesMax: number;
  dataBytesMax: number;
  rangesMax: number;
  stringBytesMax: number;
}

export const DEFAULT_LIMITS: FrameLimits = {
  controlBytesMax: 1 << 20,
  dataBytesMax: 16 << 20,
  rangesMax: 65536,
  stringBytesMax: 4096,
};

export class FrameError extends Error {
  override name = 'FrameError';
}

const U32 = 0x1_0000_0000;
const utf8 = new TextEncoder();
const utf8Strict = new TextDecoder('utf-8', { fatal: true });

class Writer {
  private buf = new Uint8Array(256);
  private view = new DataView(this.buf.buffer);
  len = 0;

  private ensure(n: number): void {
    if (this.len + n <= this.buf.length) return;
    const next = new Uint8Array(Math.max(this.buf.length * 2, this.len + n));
    next.set(this.buf.subarray(0, this.len));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }
  u8(x: number): void {
    this.ensure(1);
    this.view.setUint8(this.len, x);
    this.len += 1;
  }
  u16(x: number): void {
    this.ensure(2);
    this.view.setUint16(this.len, x);
    this.len += 2;
  }
  u32(x: number): void {
    this.ensure(4);
    this.view.setUint32(this.len, x);
    this.len += 4;
  }
  u64(x: number): void {
    assert(Number.isSafeInteger(x) && x >= 0, `u64 field must be a safe non-negative integer, got ${x}`);
    this.u32(Math.floor(x / U32));
    this.u32(x % U32);
  }
  raw(b: Uint8Array): void {
    this.ensure(b.length);
    this.buf.set(b, this.len);
    this.len += b.length;
  }
  str(s: string): void {
    const b = utf8.encode(s);
    assert(b.length < 0x10000, 'string field longer than 65535 bytes');
    this.u16(b.length);
    this.raw(b);
  }
  bytes8(b: Uint8Array): void {
    assert(b.length < 0x100, 'bytes8 field longer than 255 bytes');
    this.u8(b.length);
    this.raw(b);
  }
  /** n u32, then n x (slab u16, offset u64, length u32) from wire-packed ranges. */
  ranges(p: Float64Array): void {
    assert(p.length % WIRE_STRIDE === 0, 'wire ranges come in threes');
    const n = p.length / WIRE_STRIDE;
    this.u32(n);
    this.ensure(n * RANGE_BYTES);
    const v = this.view;
    for (let j = 0, at = this.len; j < p.length; j += WIRE_STRIDE, at += RANGE_BYTES) {
      const slab = p[j] as number;
      const offset = p[j + 1] as number;
      const length = p[j + 2] as number;
      assert(slab >= 0 && slab < 0x10000 && Number.isInteger(slab), `range slab must be a u16, got ${slab}`);
      assert(
        Number.isSafeInteger(offset) && offset >= 0,
        `range offset must be a safe non-negative integer, got ${offset}`,
      );
      assert(length >= 0 && length < U32 && Number.isInteger(length), `range length must be a u32, got ${length}`);
      v.setUint16(at, slab);
      v.setUint32(at + 2, Math.floor(offset / U32));
      v.setUint32(at + 6, offset % U32);
      v.setUint32(at + 10, length);
    }
    this.len += n * RANGE_BYTES;
  }
  bytes(): Uint8Array {
    return this.buf.subarray(0, this.len);
  }
}

class Reader {
  private pos = 0;
  private readonly view: DataView;
  constructor(
    private readonly b: Uint8Array,
    private readonly limits: FrameLimits,
  ) {
    this.view = new DataView(b.buffer, b.byteOffset, b.byteLength);
  }
  private need(n: number): void {
    if (this.pos + n > this.b.length)
      throw new FrameError(`frame body truncated (need ${n} bytes at ${this.pos} of ${this.b.length})`);
  }
  u8(): number {
    this.need(1);
    return this.view.getUint8(this.pos++);
  }
  u16(): number {
    this.need(2);
    const x = this.view.getUint16(this.pos);
    this.pos += 2;
    return x;
  }
  u32(): number {
    this.need(4);
    const x = this.view.getUint32(this.pos);
    this.pos += 4;
    return x;
  }
  u64(): number {
    const hi = this.u32();
    const lo = this.u32();
    if (hi >= 1 << 21) throw new FrameError('u64 field beyond 2^53');
    return hi * U32 + lo;
  }
  str(): string {
    const n = this.u16();
    if (n > this.limits.stringBytesMax)
      throw new FrameError(`string of ${n} bytes exceeds ${this.limits.stringBytesMax}`);
    this.need(n);
    const s = this.b.subarray(this.pos, this.pos + n);
    this.pos += n;
    try {
      return utf8Strict.decode(s);
      // catch-ok: only TextDecoder.decode runs in the try: its TypeError means bad utf-8
    } catch {
      throw new FrameError('string is not valid utf-8');
    }
  }
  hex8(): string {
    const n = this.u8();
    this.need(n);
    const s = Buffer.from(this.b.buffer, this.b.byteOffset + this.pos, n).toString('hex');
    this.pos += n;
    return s;
  }
  remaining(): number {
    return this.b.length - this.pos;
  }
  /** `n` ranges of RANGE_BYTES each, wire-packed. */
  ranges(n: number): Float64Array {
    this.need(n * RANGE_BYTES);
    const out = new Float64Array(n * WIRE_STRIDE);
    const v = this.view;
    for (let i = 0, at = this.pos; i < out.length; i += WIRE_STRIDE, at += RANGE_BYTES) {
      const hi = v.getUint32(at + 2);
      if (hi >= 1 << 21) throw new FrameError('u64 field beyond 2^53');
      out[i] = v.getUint16(at);
      out[i + 1] = hi * U32 + v.getUint32(at + 6);
      out[i + 2] = v.getUint32(at + 10);
    }
    this.pos += n * RANGE_BYTES;
    return out;
  }
  end(): void {
    if (this.pos !== this.b.length) throw new FrameError(`${this.b.length - this.pos} trailing bytes in frame body`);
  }
}

function hexBytes(hex: string): Uint8Array {
  assert(/^([0-9a-f]{2})*$/.test(hex), 'hex field must be lowercase hex of whole bytes');
  return Buffer.from(hex, 'hex');
}

function withHeader(type: number, body: Uint8Array): Uint8Array {
  const out = new Uint8Array(FRAME_HEADER_BYTES + body.length);
  const v = new DataView(out.buffer);
  v.setUint32(0, body.length);
  v.setUint8(4, type);
  out.set(body, FRAME_HEADER_BYTES);
  return out;
}

export function encodeFrame(f: ControlFrame): Uint8Array {
  const w = new Writer();
  switch (f.type) {
    case 'hello':
      w.str(f.engineId);
      w.bytes8(hexBytes(f.session));
      return withHeader(TYPE.hello, w.bytes());
    case 'helloOk':
      return withHeader(TYPE.helloOk, w.bytes());
    case 'read':
    case 'write':
      w.u32(f.reqId);
      w.str(f.transferId);
      w.bytes8(hexBytes(f.grantToken));
      w.ranges(f.ranges);
      return withHeader(f.type === 'read' ? TYPE.read : TYPE.write, w.bytes());
    case 'done':
      w.u32(f.reqId);
      return withHeader(TYPE.done, w.bytes());
    case 'error':
      w.u32(f.reqId);
      w.str(f.code);
      w.str(f.message.slice(0, 1000));
      return withHeader(TYPE.error, w.bytes());
    case 'side':
      return withHeader(TYPE.side, utf8.encode(JSON.stringify(f.body)));
  }
}

/** Header of a DATA frame; the caller writes `length` payload bytes right after it. */
export function encodeDataHeader(reqId: number, streamOffset: number, length: number): Uint8Array {
  assert(length > 0, 'DATA frame payload must not be empty');
  const w = new Writer();
  w.u32(DATA_HEAD_BYTES + length);
  w.u8(TYPE.data);
  w.u32(reqId);
  w.u64(streamOffset);
  return w.bytes().slice();
}

function parseControl(type: number, body: Uint8Array, limits: FrameLimits): ControlFrame {
  const r = new Reader(body, limits);
  let f: ControlFrame;
  switch (type) {
    case TYPE.hello:
      f = { type: 'hello', engineId: r.str(), session: r.hex8() };
      break;
    case TYPE.helloOk:
      f = { type: 'helloOk' };
      break;
    case TYPE.read:
    case TYPE.write: {
      const reqId = r.u32();
      const transferId = r.str();
      const grantToken = r.hex8();
      const n = r.u32();
      if (n > limits.rangesMax) throw new FrameError(`${n} ranges exceed ${limits.rangesMax}`);
      if (n * RANGE_BYTES !== r.remaining()) throw new FrameError(`range count ${n} does not match the body`);
      const ranges = r.ranges(n);
      f = { type: type === TYPE.read ? 'read' : 'write', reqId, transferId, grantToken, ranges };
      break;
    }
    case TYPE.done:
      f = { type: 'done', reqId: r.u32() };
      break;
    case TYPE.error:
      f = { type: 'error', reqId: r.u32(), code: r.str(), message: r.str() };
      break;
    case TYPE.side: {
      let text: string;
      try {
        text = utf8Strict.decode(body);
        // catch-ok: only TextDecoder.decode runs in the try: its TypeError means bad utf-8
      } catch {
        throw new FrameError('side frame is not valid utf-8');
      }
      try {
        return { type: 'side', body: JSON.parse(text) as unknown };
        // catch-ok: only JSON.parse runs in the try: its SyntaxError means bad JSON
      } catch {
        throw new FrameError('side frame is not valid JSON');
      }
    }
    default:
      throw new FrameError(`unknown frame type ${type}`);
  }
  r.end();
  return f;
}

type State = 'header' | 'control' | 'dataHead' | 'payload' | 'broken';

/** Incremental decoder: push socket chunks of any size; frames and DATA pieces go to the sink. */
export class FrameDecoder {
  private state: State = 'header';
  private readonly head = new Uint8Array(FRAME_HEADER_BYTES + DATA_HEAD_BYTES);
  private headLen = 0;
  private type = 0;
  private bodyLen = 0;
  private body: Uint8Array = new Uint8Array(0);
  private bodyGot = 0;
  private data: DataHead = { reqId: 0, streamOffset: 0, length: 0 };
  private payloadGot = 0;

  constructor(
    private readonly sink: FrameSink,
    private readonly limits: FrameLimits = DEFAULT_LIMITS,
  ) {}

  /** Bytes of a partial frame held (header, control body); DATA payloads are never held. */
  get bufferedBytes(): number {
    return this.state === 'control' ? this.bodyGot : this.headLen;
  }

  /**
   * Inside a DATA payload: its request, the payload bytes still to come, the frame's head and how far into
   * its payload we are; else null.
   */
  get payloadPending(): { reqId: number; left: number; head: DataHead; at: number } | null {
    if (this.state !== 'payload') return null;
    return { reqId: this.data.reqId, left: this.data.length - this.payloadGot, head: this.data, at: this.payloadGot };
  }

  /**
   * The next `n` bytes of the payload in progress arrived without passing through push() (the reader put
   * them in place itself, scatter receive): move past them. Returns the frame's head and where in its
   * payload they start. `n` must lie within the payload left.
   */
  payloadInPlace(n: number): { head: DataHead; at: number } {
    assert(
      this.state === 'payload' && n > 0 && n <= this.data.length - this.payloadGot,
      'payloadInPlace: not in this payload',
    );
    const head = this.data;
    const at = this.payloadGot;
    this.payloadGot += n;
    if (this.payloadGot === head.length) this.reset();
    return { head, at };
  }

  /**
   * Bytes that complete the frame header in progress if the frame is DATA (header and DATA head):
   * a reader that expects bulk data reads exactly these, so the payload can go straight to its
   * destination. 0 inside a control body or a payload.
   */
  get dataHeaderLeft(): number {
    return this.state === 'header' || this.state === 'dataHead'
      ? FRAME_HEADER_BYTES + DATA_HEAD_BYTES - this.headLen
      : 0;
  }

  /** True between frames (nothing partial). */
  get idle(): boolean {
    return this.state === 'header' && this.headLen === 0;
  }

  push(chunk: Uint8Array): void {
    if (this.state === 'broken') throw new FrameError('decoder already failed');
    try {
      this.consume(chunk);
    } catch (e) {
      this.state = 'broken';
      throw e;
    }
  }

  private consume(chunk: Uint8Array): void {
    let pos = 0;
    while (pos < chunk.length) {
      if (this.state === 'header' || this.state === 'dataHead') {
        const want = this.state === 'header' ? FRAME_HEADER_BYTES : FRAME_HEADER_BYTES + DATA_HEAD_BYTES;
        const n = Math.min(want - this.headLen, chunk.length - pos);
        this.head.set(chunk.subarray(pos, pos + n), this.headLen);
        this.headLen += n;
        pos += n;
        if (this.headLen < want) return;
        if (this.state === 'header') this.onHeader();
        else this.onDataHead();
      } else if (this.state === 'control') {
        const n = Math.min(this.bodyLen - this.bodyGot, chunk.length - pos);
        this.body.set(chunk.subarray(pos, pos + n), this.bodyGot);
        this.bodyGot += n;
        pos += n;
        if (this.bodyGot === this.bodyLen) this.emitControl();
      } else {
        const n = Math.min(this.data.length - this.payloadGot, chunk.length - pos);
        const at = this.payloadGot;
        this.payloadGot += n;
        if (this.payloadGot === this.data.length) this.reset();
        this.sink.data(this.data, chunk.subarray(pos, pos + n), at);
        pos += n;
      }
    }
  }

  private onHeader(): void {
    const v = new DataView(this.head.buffer, 0, FRAME_HEADER_BYTES);
    this.bodyLen = v.getUint32(0);
    this.type = v.getUint8(4);
    if (this.type === TYPE.data) {
      if (this.bodyLen <= DATA_HEAD_BYTES) throw new FrameError('DATA frame without payload');
      if (this.bodyLen - DATA_HEAD_BYTES > this.limits.dataBytesMax)
        throw new FrameError(`DATA frame of ${this.bodyLen} bytes too large`);
      this.state = 'dataHead';
      return;
    }
    if (this.type < TYPE.hello || this.type > TYPE.side) throw new FrameError(`unknown frame type ${this.type}`);
    if (this.bodyLen > this.limits.controlBytesMax)
      throw new FrameError(`frame of ${this.bodyLen} bytes exceeds ${this.limits.controlBytesMax}`);
    this.body = new Uint8Array(this.bodyLen);
    this.bodyGot = 0;
    this.state = 'control';
    if (this.bodyLen === 0) this.emitControl();
  }

  private onDataHead(): void {
    const v = new DataView(this.head.buffer, FRAME_HEADER_BYTES, DATA_HEAD_BYTES);
    const hi = v.getUint32(4);
    if (hi >= 1 << 21) throw new FrameError('DATA stream offset beyond 2^53');
    this.data = {
      reqId: v.getUint32(0),
      streamOffset: hi * U32 + v.getUint32(8),
      length: this.bodyLen - DATA_HEAD_BYTES,
    };
    this.payloadGot = 0;
    this.state = 'payload';
  }

  private emitControl(): void {
    const f = parseControl(this.type, this.body, this.limits);
    this.reset();
    this.sink.frame(f);
  }

  private reset(): void {
    this.state = 'header';
    this.headLen = 0;
    this.body = new Uint8Array(0);
    this.bodyGot = 0;
  }
}
