/**
 * What every backend's host side shares: the checks on a posted work request's local ranges, and
 * waiting on a set of handles with one timeout (first failure wins; all done resolves; the timeout names
 * the transfers still pending and uses KV_READ_TIMEOUT when a READ is among them).
 */
import { assert } from '../util/assert.ts';
import type { Env, TimerHandle } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { rangeProblem } from './ranges.ts';
import type { SlabLayout, TransferHandle, TransferRequest } from './types.ts';

export interface WaitableHandle {
  handle: TransferHandle;
  state: 'pending' | 'done' | 'failed';
  error: HandoffError | null;
  waiters: Set<() => void>;
}

/** Programmer errors in a work request's local side (the remote side is checked by the peer's grant). */
export function checkLocalRanges(req: TransferRequest, layout: SlabLayout): void {
  assert(req.ranges.length > 0, 'a work request needs at least one range');
  for (const r of req.ranges) {
    const problem = rangeProblem({ slab: r.slab, offset: r.localOffset, length: r.length }, layout);
    assert(problem === null, () => `local range: ${problem}`);
    assert(Number.isSafeInteger(r.remoteOffset) && r.remoteOffset >= 0, `bad remote offset ${r.remoteOffset}`);
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
      reject(new HandoffError(code, `${pending.length} of ${sts.length} transfers not done after ${timeoutMs} ms (${ids.join(', ')})`, { transferIds: ids }));
    });
  });
}
