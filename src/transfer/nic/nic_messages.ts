/**
 * What the engine thread (host) and its NIC thread tell each other, plus the shared completion
 * queue layout. Plain data only: these cross a thread boundary.
 *
 *   host --control port (commands, drained synchronously by the NIC before every grant check)--> NIC
 *   host <--parentPort (completions, replies)-------------------------------------------------- NIC
 *   host <--cq SharedArrayBuffer (slot state, read with Atomics by poll())--------------------- NIC
 */
import type { MessagePort } from 'node:worker_threads';
import { ERROR_CODES, type ErrorCode } from '../../util/errors.ts';
import type { NicCompletionEvent } from '../core/nic.ts';
import type { SlabLayout } from '../core/types.ts';
import type { RawConfig } from '../tcp/nic_tcp_raw.ts';

export { CQ_DONE, CQ_FAILED, CQ_FREE, CQ_PENDING } from '../core/nic.ts';

/** Completion queue: Int32Array of 2 ints per slot: [state, error code index]. */
export const CQ_INTS_PER_SLOT = 2;

/** Counters the NIC thread increments with Atomics (Int32Array indexes). */
export const COUNTER = {
  grantsRefused: 0,
  readsServed: 1,
  writesAccepted: 2,
  badFrames: 3,
  scatterReads: 4,
  writesCut: 5,
} as const;
export const COUNTER_INTS = 6;

export const ERROR_CODE_LIST = Object.keys(ERROR_CODES) as ErrorCode[];

export function errorCodeIndex(code: ErrorCode): number {
  return ERROR_CODE_LIST.indexOf(code);
}

export function asErrorCode(code: string): ErrorCode {
  return (ERROR_CODE_LIST as string[]).includes(code) ? (code as ErrorCode) : 'TRANSFER_FAILED';
}

export interface NicInit {
  kind: 'inproc' | 'tcp';
  engineId: string;
  layout: SlabLayout;
  slabs: SharedArrayBuffer[];
  cq: SharedArrayBuffer;
  counters: SharedArrayBuffer;
  control: MessagePort;
  /** tcp: where the data plane listens. */
  listenHost: string;
  dataPort: number;
  dataFrameBytes: number;
  recvDirectMinBytes: number;
  scatterRecv: boolean;
  lanes: number;
  laneMinBytes: number;
}

export interface WorkRequest {
  wrId: number;
  slot: number;
  kind: 'read' | 'write';
  peerEngineId: string;
  transferId: string;
  grantToken: string;
  /** Coalesced, packed with packRanges. */
  ranges: Float64Array;
  delayMs: number;
  /** Fault injection: fail with this code instead of moving data. */
  failWith: ErrorCode | null;
}

/** `direct`: the port the peer's engine posts its work requests on straight to this NIC (direct_link.ts). */
export type InprocPeer = { port: MessagePort; slabs: SharedArrayBuffer[]; direct: MessagePort };
export type TcpPeer = { host: string; port: number; session: string };

export type NicCommand =
  /** expiresAtEpochMs: performance.timeOrigin + performance.now() based, the same in every thread. */
  | {
      t: 'grant';
      transferId: string;
      token: string;
      peerEngineId: string | null;
      blockIds: number[];
      expiresAtEpochMs: number;
    }
  | { t: 'revoke'; transferId: string }
  /** Answer `drained` once nothing reads `transferId`'s pages (after its revoke: Nic.drainGrant). */
  | { t: 'drain'; transferId: string; id: number }
  /**
   * tcp: `peerEngineId` may open a data connection to us presenting `session`. `dialing`: offered in the
   * hello of a handshake still under way (it counts against none of the peer's sessions until it succeeds).
   */
  | { t: 'session'; session: string; peerEngineId: string; dialing?: boolean }
  /** tcp: the handshake that offered `session` failed: nobody may present it any more. */
  | { t: 'unsession'; session: string }
  | { t: 'peer'; peerEngineId: string; inproc?: InprocPeer; tcp?: TcpPeer }
  | { t: 'unpeer'; peerEngineId: string }
  | { t: 'post'; wr: WorkRequest }
  | { t: 'abort'; wrId: number }
  | { t: 'rawServe' }
  | { t: 'rawRecv'; host: string; port: number; bytes: number; cfg: RawConfig }
  /** inproc bench baseline: copy packed ranges (as a READ by the peer would) with no protocol, timed here. */
  | { t: 'rawCopy'; peerEngineId: string; ranges: Float64Array }
  | { t: 'close' };

export type NicEvent =
  | { t: 'ready'; dataPort: number }
  | NicCompletionEvent
  | { t: 'drained'; id: number }
  | { t: 'rawPort'; port: number }
  | { t: 'rawDone'; bytes: number }
  | { t: 'rawCopied'; ms: number }
  | { t: 'closed' };
