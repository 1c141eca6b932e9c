/**
 * What every backend's host side shares: the checks on a posted work request's local ranges, and
 * waiting on a set of handles with one timeout (first failure wins; all done resolves; the timeout names
 * the transfers still pending and uses KV_READ_TIMEOUT when a READ is among them).
 */
import { assert, rethrowIfAssertion } from '../../util/assert.ts';
import type { Env, TimerHandle } from '../../util/env.ts';
import { HandoffError, type ErrorCode } from '../../util/errors.ts';
import { isTokenFormat, type ReleaseOutcome } from './grant_table.ts';
import { PACKED_STRIDE, sideOf, sideProblem } from './ranges.ts';
import type {
  Notification,
  NotificationHandler,
  SlabLayout,
  TransferHandle,
  TransferRange,
  TransferRequest,
} from './types.ts';

export interface WaitableHandle {
  handle: TransferHandle;
  state: 'pending' | 'done' | 'failed';
  error: HandoffError | null;
  waiters: Set<() => void>;
}

/**
 * Programmer errors in a work request's local side (the remote side is checked by the peer's grant).
 * `packed`: the request's ranges as packRanges lays them out.
 */
export function checkLocalRanges(packed: Float64Array, layout: SlabLayout): void {
  assert(packed.length > 0, 'a work request needs at least one range');
  const problem = sideProblem(sideOf(packed, 'local'), layout);
  assert(problem === null, () => `local range: ${problem}`);
  for (let j = 3; j < packed.length; j += PACKED_STRIDE) {
    const remote = packed[j] as number;
    assert(Number.isSafeInteger(remote) && remote >= 0, () => `bad remote offset ${remote}`);
  }
}

export function waitForHandles<S extends WaitableHandle>(
  env: Env,
  sts: readonly S[],
  timeoutMs: number,
  hooks: { refresh?: (st: S) => void; observe: (st: S) => void },
): Promise<void> {
  assert(Number.isFinite(timeoutMs) && timeoutMs >= 0, `wait timeout must be >= 0, got ${timeoutMs}`);
  return new Promise<void>((resolve, reject) => {
    let settled = false;
    let timer: TimerHandle | null = null;
    const settle = (): void => {
      settled = true;
      timer?.cancel();
      for (const st of sts) st.waiters.delete(check);
    };
    function check(): void {
      if (settled) return;
      if (hooks.refresh) for (const st of sts) hooks.refresh(st);
      const failed = sts.find((s) => s.state === 'failed');
      if (failed !== undefined) {
        settle();
        hooks.observe(failed);
        reject(failed.error);
      } else if (sts.every((s) => s.state === 'done')) {
        settle();
        for (const st of sts) hooks.observe(st);
        resolve();
      }
    }
    check();
    if (settled) return;
    for (const st of sts) if (st.state === 'pending') st.waiters.add(check);
    timer = env.setTimer(timeoutMs, () => {
      if (settled) return;
      settle();
      const pending = sts.filter((s) => s.state === 'pending');
      const code = pending.some((s) => s.handle.kind === 'read') ? 'KV_READ_TIMEOUT' : 'TIMEOUT';
      const ids = [...new Set(pending.map((s) => s.handle.transferId))];
      reject(
        new HandoffError(
          code,
          `${pending.length} of ${sts.length} transfers not done after ${timeoutMs} ms (${ids.join(', ')})`,
          { transferIds: ids },
        ),
      );
    });
  });
}

/** One work request's ranges after coalescing (one tcp frame carries at most this many). */
export const DESCRIPTORS_MAX = 65_536;

/**
 * Operating errors a posted work request fails with at once, before anything moves: no handshake with
 * the peer, a malformed token or transfer id, too many descriptors, remote ranges outside the peer's slabs.
 */
export function workRequestProblem(
  req: TransferRequest,
  packed: Float64Array,
  peerLayout: SlabLayout | undefined,
): { code: ErrorCode; message: string } | null {
  if (peerLayout === undefined)
    return { code: 'PEER_UNAVAILABLE', message: `no handshake with peer ${req.peerEngineId}` };
  if (!isTokenFormat(req.grantToken)) return { code: 'BAD_TRANSFER_PARAMS', message: 'malformed grant token' };
  if (req.transferId.length === 0 || req.transferId.length > 256)
    return { code: 'BAD_TRANSFER_PARAMS', message: 'transferId must be 1..256 chars' };
  const descriptors = packed.length / PACKED_STRIDE;
  if (descriptors > DESCRIPTORS_MAX)
    return { code: 'BAD_TRANSFER_PARAMS', message: `${descriptors} descriptors exceed ${DESCRIPTORS_MAX}` };
  const outside = sideProblem(sideOf(packed, 'remote'), peerLayout);
  if (outside !== null) return { code: 'BAD_TRANSFER_PARAMS', message: `remote range: ${outside}` };
  return null;
}

/** Move a pending handle to done or failed (exactly once), count it, and wake its waiters. */
export function settleHandle(
  st: WaitableHandle,
  code: ErrorCode | null,
  message: string,
  counters: { bytesRead: number; bytesWritten: number; readsFailed: number; writesFailed: number },
): boolean {
  if (st.state !== 'pending') return false;
  const { kind, bytes, transferId } = st.handle;
  if (code === null) {
    st.state = 'done';
    if (kind === 'read') counters.bytesRead += bytes;
    else counters.bytesWritten += bytes;
  } else {
    st.state = 'failed';
    st.error = new HandoffError(code, message || `${kind} of transfer ${transferId} failed (${code})`, { transferId });
    if (kind === 'read') counters.readsFailed++;
    else counters.writesFailed++;
  }
  for (const w of [...st.waiters]) w();
  st.waiters.clear();
  return true;
}

/**
 * Hand an arrived notification to the engine's handlers. A release / write_done / write_refused that cannot
 * prove its grant (wrong peer or token for a live grant) ends nothing and reaches no handler: otherwise anyone
 * who learned a transfer id could free another request's pages (or fail its load). Returns false when it was
 * refused.
 */
export function dispatchNotification(
  grants: { releasedBy(transferId: string, peerEngineId: string, token: unknown): ReleaseOutcome },
  handlers: ReadonlySet<NotificationHandler>,
  onHandlerError: (e: unknown) => void,
  fromEngineId: string,
  n: Notification,
): boolean {
  const outcome =
    n.type === 'release' || n.type === 'write_done' || n.type === 'write_refused'
      ? grants.releasedBy(n.transferId, fromEngineId, n.payload?.['grant'])
      : 'no-grant';
  if (outcome === 'refused') return false;
  for (const h of [...handlers]) {
    try {
      h(fromEngineId, n, outcome === 'released');
    } catch (e) {
      rethrowIfAssertion(e);
      onHandlerError(e);
    }
  }
  return true;
}
