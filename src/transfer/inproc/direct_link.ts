/**
 * inproc fast path, engine side: the engine thread posts a READ/WRITE straight to the peer's NIC thread,
 * which checks its grant, copies and answers on the same port. Two thread hops per work request
 * instead of four (engine -> own NIC -> peer NIC -> own NIC -> engine); on a busy 2-core machine each
 * hop can wait for a time slice. Work requests with a fault to play (delay, injected failure) go
 * through the local NIC, which implements the faults.
 *
 *   engine --{read|write, wrId}--> peer NIC: grant check, copy --{done|error}--> engine (cq event)
 *          --{abort}------------->           (FIFO: after its copy) --{aborted}--> engine (aborted event)
 *
 * Completions arrive as the NIC's events do (`cq`, `aborted`); the completion queue slot is not written
 * (the engine's wait() takes these events; poll() sees them once the event loop delivered them).
 */
import type { MessagePort } from 'node:worker_threads';
import { asErrorCode, type NicEvent, type WorkRequest } from '../nic/nic_messages.ts';
import type { LinkMessage } from './nic_inproc.ts';

export class DirectLink {
  /** Work requests posted and not answered: whether an abort was sent for each. */
  private readonly pending = new Map<number, { aborting: boolean }>();
  private closed = false;

  constructor(
    private readonly port: MessagePort,
    private readonly peerEngineId: string,
    private readonly emit: (ev: NicEvent) => void,
  ) {
    port.on('message', (m: LinkMessage) => this.onMessage(m));
    port.on('close', () => this.close(`peer ${peerEngineId} closed its link`));
  }

  has(wrId: number): boolean {
    return this.pending.has(wrId);
  }

  /** `ranges`: shared memory (the host's ring), read by the peer while the request is pending. */
  post(wr: Omit<WorkRequest, 'ranges'>, ranges: Float64Array): void {
    if (this.closed) {
      this.emit({
        t: 'cq',
        wrId: wr.wrId,
        code: 'PEER_UNAVAILABLE',
        message: `link to ${this.peerEngineId} is closed`,
      });
      return;
    }
    this.pending.set(wr.wrId, { aborting: false });
    const m: LinkMessage = { t: wr.kind, reqId: wr.wrId, transferId: wr.transferId, token: wr.grantToken, ranges };
    this.port.postMessage(m);
  }

  /** True when `wrId` is ours: its `aborted` event follows once the peer will not copy for it. */
  abort(wrId: number): boolean {
    const p = this.pending.get(wrId);
    if (p === undefined) return false;
    if (!p.aborting) {
      p.aborting = true;
      this.port.postMessage({ t: 'abort', reqId: wrId } satisfies LinkMessage);
    }
    return true;
  }

  private onMessage(m: LinkMessage): void {
    const p = this.pending.get(m.reqId);
    if (p === undefined) return;
    if (m.t === 'done' || m.t === 'error') {
      const code = m.t === 'done' ? null : asErrorCode(m.code);
      this.emit({ t: 'cq', wrId: m.reqId, code, message: m.t === 'done' ? '' : m.message });
      // An abort in flight still gets its answer, after this one.
      if (!p.aborting) this.pending.delete(m.reqId);
    } else if (m.t === 'aborted') {
      this.pending.delete(m.reqId);
      this.emit({ t: 'cq', wrId: m.reqId, code: 'REQUEST_ABORTED', message: `work request ${m.reqId} aborted` });
      this.emit({ t: 'aborted', wrId: m.reqId });
    }
  }

  /** Fail what is pending (acknowledging aborts: the peer is gone) and close the port. */
  close(reason: string): void {
    if (this.closed) return;
    this.closed = true;
    for (const [wrId, p] of this.pending) {
      this.emit({ t: 'cq', wrId, code: 'PEER_UNAVAILABLE', message: reason });
      if (p.aborting) this.emit({ t: 'aborted', wrId });
    }
    this.pending.clear();
    this.port.close();
  }
}
