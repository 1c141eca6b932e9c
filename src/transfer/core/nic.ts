/**
 * What the transfer engine core (transfer_engine.ts) needs from the thing that executes its one-sided
 * work requests: the NIC. Two implementations:
 *   - the thread NIC (nic/nic_host.ts): a worker thread that moves bytes between SharedArrayBuffer slabs
 *     (inproc) or over TCP, enforces grants in its own table and completes through a shared
 *     completion queue;
 *   - the sim NIC (sim/sim_nic.ts): work requests are items on the simulator's fabric and complete only
 *     when the explorer runs them.
 *
 *   core --post/abort/grant/revokeGrant--> NIC --(moves bytes, checks the serving side's grants)
 *   core <--onCompletion: cq, aborted--------------+   slotState(): the completion queue, read directly
 *
 * Side-channel traffic (handshake, notifications) belongs to the backend, which links peers to its NIC
 * its own way. A NIC may answer synchronously (the sim NIC emits `cq` and `aborted` inside post/abort);
 * the core handles both.
 */
import type { OpLabel } from '../../device/types.ts';
import type { ErrorCode } from '../../util/errors.ts';

/** Completion-queue slot states (the thread NIC keeps them in a SharedArrayBuffer read with Atomics). */
export const CQ_FREE = 0;
export const CQ_PENDING = 1;
export const CQ_DONE = 2;
export const CQ_FAILED = 3;

/** What a NIC tells the core: a work request ended, or an abort took effect. */
export type NicCompletionEvent =
  { t: 'cq'; wrId: number; code: ErrorCode | null; message: string } | { t: 'aborted'; wrId: number };

/** One posted READ or WRITE. */
export interface NicWorkRequest {
  wrId: number;
  /** Its completion-queue slot (allocSlot). */
  slot: number;
  kind: 'read' | 'write';
  peerEngineId: string;
  transferId: string;
  grantToken: string;
  /**
   * Coalesced, packed as packRanges lays them out ([slab, localOffset, remoteSlab, remoteOffset, length] * n).
   * Valid only during post(): the poster reuses the buffer, so a NIC copies what it keeps.
   */
  ranges: Float64Array;
  label: OpLabel;
  /** The race checker's id for it, or null without a checker. */
  checkerWrId: number | null;
  /** The NIC starts it this much later (fault: a slow NIC). */
  delayMs: number;
  /** Fault injection: fail with this code instead of moving data. */
  failWith: ErrorCode | null;
}

/** Why a grant stopped being live (the sim NIC reports it to the simulator's oracles). */
export type GrantEnd = 'revoked' | 'expired' | 'released';

export interface NicStats {
  /** Work requests this NIC refused with GRANT_DENIED (as the serving side). */
  grantsRefused: number;
  /** Data-plane connections closed because of malformed frames (tcp). */
  badFrames: number;
  /** readv calls that received payload straight into pages (tcp scatter receive, READ replies and WRITEs). */
  scatterReads: number;
  /** WRITEs into this engine stopped mid-payload because their grant was revoked (tcp: denied, nothing more lands). */
  writesCut: number;
}

export interface Nic {
  /** Completion-queue slots: work requests in flight at once. */
  readonly slotsMax: number;
  /** A free slot marked pending, or null when slotsMax work requests are in flight. */
  allocSlot(): number | null;
  freeSlot(slot: number): void;
  /** CQ_PENDING, CQ_DONE or CQ_FAILED (above), with the error code when failed. */
  slotState(slot: number): { state: number; code: ErrorCode };
  post(wr: NicWorkRequest): void;
  /** Stop work request `wrId`; the NIC answers with `aborted` once it will not touch memory for it. */
  abort(wrId: number): void;
  /** The host saw the terminal state of `wrId` (after cq). */
  observed(wrId: number): void;
  /** Admit `peerEngineId` (null: any holder of the token) to `blockIds` until `ttlMs` from now. */
  grant(transferId: string, token: string, peerEngineId: string | null, blockIds: number[], ttlMs: number): void;
  revokeGrant(transferId: string, why: GrantEnd): void;
  /**
   * Settles once the NIC no longer reads or writes pages for `transferId` (call it after the grant is
   * revoked, so no new work request of it is served): a READ reply still being sent, a WRITE still being
   * pushed. Only then may the pages go back to the pool.
   */
  drainGrant(transferId: string): Promise<void>;
  /** Completions and aborts, in the order the NIC produced them. */
  onCompletion(fn: (ev: NicCompletionEvent) => void): () => void;
  stats(): NicStats;
  /** The NIC's clock for the work-request log: epoch ms (thread NIC) or virtual ms (sim NIC). */
  nowEpochMs(): number;
  /** Void when the NIC stops at once (sim), so a killed engine's traffic ends in the same step. */
  close(): Promise<void> | void;
}
