/**
 * tcp side channel messages and one connection's plumbing (engine thread). Messages are JSON in
 * `side` frames (frame.ts), validated with zod; anything invalid closes the connection.
 *
 *   dialer                                   listener
 *     <------------- challenge {nonce, engineId}
 *     hello {meta, proof, nonce, data addr, session} -->    checks secret proof + compatibility
 *     <------------- welcome {meta, proof, data addr, session}  |  refuse {code, message}, close
 *   then either side: notify {seq, n} --> / <-- ack {seq}
 *
 * proof = HMAC-SHA256(secret, "<role>|<other side's nonce>|<own engineId>"), so both sides prove the
 * secret and a proof cannot be replayed on another connection. `session` is the token the other
 * side must present on our data port (the NIC thread checks it).
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import type net from 'node:net';
import { z } from 'zod';
import { HandoffError } from '../../util/errors.ts';
import { FrameDecoder, FrameError, encodeFrame, type ControlFrame, type FrameSink } from './frame.ts';
import { NOTIFICATION_TYPES, type Notification } from '../core/types.ts';

const hex = z.string().regex(/^[0-9a-f]{32,128}$/);
const name = z.string().min(1).max(256);
const posInt = z.number().int().positive().max(Number.MAX_SAFE_INTEGER);

const metaSchema = z.object({
  engineId: name,
  modelName: z.string().max(256),
  preset: z.string().max(256),
  weightSeed: z.number().int().nonnegative().max(Number.MAX_SAFE_INTEGER).optional(),
  layout: z.object({
    numSlabs: posInt,
    numBlocks: posInt,
    pageBytes: posInt,
    // Absent in peers from before tensor parallelism: they run TP=1.
    tensorParallelSize: z.number().int().min(1).max(1024).default(1),
    blockSizes: z.array(posInt).min(1).max(64),
    pageFormats: z
      .array(
        z.discriminatedUnion('kind', [
          z.object({ kind: z.literal('tokens'), regionTokenBytes: z.array(posInt).min(1).max(16) }),
          z.object({ kind: z.literal('state'), stateBytes: posInt }),
        ]),
      )
      .max(64)
      .optional(),
    tpSplits: z.array(z.number().int().nonnegative().max(Number.MAX_SAFE_INTEGER)).max(64).optional(),
  }),
  compatHash: z.string().max(128),
});

const notificationSchema = z.object({
  type: z.enum(NOTIFICATION_TYPES),
  transferId: z.string().max(256),
  payload: z.record(z.string(), z.unknown()).optional(),
});

const addr = { dataHost: z.string().max(256), dataPort: z.number().int().min(1).max(65535), session: hex };

export const sideMessageSchema = z.discriminatedUnion('m', [
  z.object({ m: z.literal('challenge'), nonce: hex, engineId: name }),
  z.object({ m: z.literal('hello'), meta: metaSchema, proof: z.string().max(128), nonce: hex, ...addr }),
  z.object({ m: z.literal('welcome'), meta: metaSchema, proof: z.string().max(128), ...addr }),
  z.object({ m: z.literal('refuse'), code: z.string().max(64), message: z.string().max(2000) }),
  z.object({ m: z.literal('notify'), seq: z.number().int().nonnegative(), n: notificationSchema }),
  z.object({ m: z.literal('ack'), seq: z.number().int().nonnegative() }),
]);

export type SideMessage = z.infer<typeof sideMessageSchema>;

export function proof(secret: string, role: 'client' | 'server', nonce: string, engineId: string): string {
  return createHmac('sha256', secret).update(`${role}|${nonce}|${engineId}`).digest('hex');
}

export function proofMatches(
  secret: string,
  role: 'client' | 'server',
  nonce: string,
  engineId: string,
  got: string,
): boolean {
  const want = Buffer.from(proof(secret, role, nonce, engineId), 'hex');
  const have = Buffer.from(/^[0-9a-f]*$/.test(got) ? got : '', 'hex');
  return have.length === want.length && timingSafeEqual(have, want);
}

const PENDING_NOTIFIES_MAX = 4096;
/**
 * Answers (acks) waiting in the socket past which we stop reading the peer's messages until they drained:
 * a peer that sends notifications and never reads its acks cannot grow them without bound.
 */
export const SIDE_SEND_HIGH_WATER = 256 << 10;

/** One side-channel connection, either direction. */
export class SideConn implements FrameSink {
  /** Set once the handshake on this connection succeeded. */
  peerEngineId: string | null = null;
  private readonly decoder = new FrameDecoder(this, {
    controlBytesMax: 1 << 20,
    dataBytesMax: 0,
    rangesMax: 0,
    stringBytesMax: 0,
  });
  private readonly pending = new Map<number, { resolve: () => void; reject: (e: HandoffError) => void }>();
  private seq = 0;
  private closed = false;
  /** Replaced by a newer connection to the same peer: closed once nothing sent on it awaits an ack. */
  private retiring = false;
  /** Not reading the peer's messages until our answers drain. */
  private paused = false;

  constructor(
    readonly socket: net.Socket,
    private readonly onMessage: (conn: SideConn, msg: SideMessage) => void,
    onClose: (conn: SideConn) => void,
  ) {
    socket.setNoDelay(true);
    socket.on('data', (chunk: Buffer) => {
      if (this.closed) return;
      try {
        this.decoder.push(chunk);
      } catch (e) {
        if (!(e instanceof FrameError)) throw e;
        this.close();
      }
      this.pauseWhileBacklogged();
    });
    socket.on('error', () => {});
    socket.on('close', () => {
      this.closed = true;
      for (const p of this.pending.values()) p.reject(new HandoffError('PEER_UNAVAILABLE', 'side channel closed'));
      this.pending.clear();
      onClose(this);
    });
  }

  private pauseWhileBacklogged(): void {
    const socket = this.socket;
    if (this.paused || socket.destroyed || socket.writableLength < SIDE_SEND_HIGH_WATER) return;
    this.paused = true;
    socket.pause();
    socket.once('drain', () => {
      this.paused = false;
      socket.resume();
    });
  }

  get isClosed(): boolean {
    return this.closed || this.socket.destroyed;
  }

  send(msg: SideMessage): void {
    if (!this.isClosed) this.socket.write(encodeFrame({ type: 'side', body: msg }));
  }

  /** Refuse the handshake with a typed reason, then close. */
  refuse(code: 'UNAUTHORIZED' | 'PEER_INCOMPATIBLE' | 'BAD_REQUEST', message: string): void {
    this.send({ m: 'refuse', code, message });
    this.socket.end();
    this.closed = true;
  }

  close(): void {
    this.closed = true;
    this.socket.destroy();
  }

  /** A newer connection to the same peer took over: close this one once its notifications are acknowledged. */
  retire(): void {
    this.retiring = true;
    if (this.pending.size === 0) this.close();
  }

  notify(n: Notification): Promise<void> {
    if (this.isClosed) return Promise.reject(new HandoffError('PEER_UNAVAILABLE', 'side channel closed'));
    if (this.pending.size >= PENDING_NOTIFIES_MAX)
      return Promise.reject(new HandoffError('OVERLOADED', 'too many unacknowledged notifications'));
    const seq = this.seq++;
    return new Promise((resolve, reject) => {
      this.pending.set(seq, { resolve, reject });
      this.send({ m: 'notify', seq, n });
    });
  }

  frame(f: ControlFrame): void {
    if (f.type !== 'side') throw new FrameError(`unexpected ${f.type} frame on the side channel`);
    const parsed = sideMessageSchema.safeParse(f.body);
    if (!parsed.success)
      throw new FrameError(`invalid side channel message: ${parsed.error.issues[0]?.message ?? '?'}`);
    const msg = parsed.data;
    if (msg.m === 'ack') {
      const p = this.pending.get(msg.seq);
      if (p === undefined) throw new FrameError(`ack for unknown notification ${msg.seq}`);
      this.pending.delete(msg.seq);
      p.resolve();
      if (this.retiring && this.pending.size === 0) this.close();
      return;
    }
    this.onMessage(this, msg);
  }

  data(): void {
    throw new FrameError('DATA frame on the side channel');
  }
}
