/**
 * Test kit for tcp data planes under network faults: a NicContext over one 16 MiB slab, a relay (node:net)
 * between two planes that can stall or throttle its first connection, and READ/WRITE work requests.
 */
import net from 'node:net';
import { packRanges } from '../core/ranges.ts';
import type { NicContext } from '../nic/nic_worker.ts';
import type { WorkRequest } from '../nic/nic_messages.ts';
import type { ErrorCode } from '../../util/errors.ts';

export const PAGE = 1 << 20;
export const BLOCKS = 16;
const SESSION = 'a'.repeat(32);
export const PEER_SESSION = SESSION;

export function planeContext(
  engineId: string,
  completions: Map<number, ErrorCode | null>,
  extra: Partial<NicContext> = {},
): NicContext {
  const slabs = [new Uint8Array(new SharedArrayBuffer(PAGE * BLOCKS))];
  return {
    engineId,
    layout: { numSlabs: 1, numBlocks: BLOCKS, pageBytes: PAGE },
    slabs,
    dataFrameBytes: 1 << 20,
    recvDirectMinBytes: 1 << 16,
    scatterRecv: false,
    lanes: 1,
    laneMinBytes: 1 << 30,
    sessionPeer: (s) => (s === SESSION ? 'D' : undefined),
    checkGrant: () => ({ ok: true }),
    complete: (wrId, code) => void completions.set(wrId, code),
    count: () => {},
    emit: () => {},
    ...extra,
  };
}

export interface RelayFault {
  /** 'up': client to server, 'down': server to client. */
  dir: 'up' | 'down';
  /** Forward this many bytes that way, then nothing more (both sockets stay open). */
  stallAfter?: number;
  /** Or forward at most this many bytes that way per 50 ms (a slow link that keeps moving). */
  bytesPer50Ms?: number;
  /**
   * With bytesPer50Ms: stop reading the sender while this many bytes wait in the relay (back-pressure, as a
   * real slow link's TCP gives; without it the relay takes everything at once).
   */
  holdMax?: number;
  /** With bytesPer50Ms: counts the bytes the slow side has forwarded so far. */
  forwarded?: { bytes: number };
}

/** Relay to `target`: its first connection has `fault`; later connections pass. */
export async function relay(target: number, fault: RelayFault): Promise<net.Server> {
  let first = true;
  const server = net.createServer((client) => {
    const upstream = net.connect({ host: '127.0.0.1', port: target });
    const faulty = first;
    first = false;
    let moved = 0;
    const pipe = (from: net.Socket, to: net.Socket, isFaulty: boolean): void => {
      const slow = isFaulty && fault.bytesPer50Ms !== undefined ? slowLink(from, to, fault.bytesPer50Ms, fault) : null;
      from.on('data', (d: Buffer) => {
        if (!isFaulty) return void to.write(d);
        if (slow !== null) return slow(d);
        const stallAfter = fault.stallAfter ?? 0;
        const n = Math.max(0, Math.min(d.length, stallAfter - moved));
        moved += n;
        if (n > 0) to.write(d.subarray(0, n));
        if (moved >= stallAfter) from.pause(); // the link is silent from here on; TCP backs up
      });
      from.on('error', () => {});
      from.on('close', () => to.destroy());
    };
    pipe(client, upstream, faulty && fault.dir === 'up');
    pipe(upstream, client, faulty && fault.dir === 'down');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return server;
}

/**
 * A link from `from` to `to` that forwards at most `per` bytes every 50 ms, in order; returns the function
 * taking bytes. `holdMax`: `from` is paused while that many bytes wait.
 */
function slowLink(
  from: net.Socket,
  to: net.Socket,
  per: number,
  o: Pick<RelayFault, 'holdMax' | 'forwarded'>,
): (d: Buffer) => void {
  let queue = Buffer.alloc(0);
  let pumping = false;
  const holdMax = o.holdMax ?? Infinity;
  const pump = (): void => {
    if (to.destroyed || queue.length === 0) return void (pumping = false);
    const n = Math.min(per, queue.length);
    to.write(queue.subarray(0, n));
    if (o.forwarded) o.forwarded.bytes += n;
    queue = queue.subarray(n);
    if (queue.length < holdMax && from.isPaused()) from.resume();
    setTimeout(pump, 50);
  };
  return (d) => {
    queue = Buffer.concat([queue, d]);
    if (queue.length >= holdMax) from.pause();
    if (!pumping) {
      pumping = true;
      pump();
    }
  };
}

/** `pages` pages from page `first` on, to the same place on the other side. */
export function workRequest(wrId: number, kind: 'read' | 'write', pages: number, first = 0): WorkRequest {
  const at = first * PAGE;
  return {
    wrId,
    slot: 0,
    kind,
    peerEngineId: 'P',
    transferId: `t${wrId}`,
    grantToken: 'b'.repeat(32),
    ranges: packRanges([{ slab: 0, localOffset: at, remoteOffset: at, length: pages * PAGE }]),
    delayMs: 0,
    failWith: null,
  } as WorkRequest;
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
