/**
 * Producer (prefill, READ and WRITE modes), worker side: the transfers whose pages this instance holds
 * for a peer, and whether the peer released them.
 *
 *   held ──release──> draining ──(NIC drained)──> released ──(finishedSending)──> removed
 *   (release before the metadata named the transfer) released-early ──metadata──> draining
 *
 * The scheduler side sends the full transfer → request map of held pages every step (`sendTransfers`);
 * a held transfer it no longer names (lease over, request gone) is dropped. A release revokes the
 * transfer's grant at once, and the pages are reported only once the NIC says it sends nothing more from
 * them: a READ admitted under the grant (another request naming the same transfer, a reply under way)
 * may still be reading them. Releases for transfers never named are kept, bounded, for a while.
 *
 * A lease that ended (READ mode, `expire`): the grant is revoked, and the request is reported once the NIC
 * says it sends nothing more from the pages (a reply under way when the lease ended goes out first).
 */
import { TransferTable } from './transfer_table.ts';
import type { WorkerContext } from './worker_context.ts';

type ProducerState = 'held' | 'released-early' | 'draining' | 'released';
interface HeldTransfer {
  state: ProducerState;
  requestId: string | null;
  /** released-early: when the release came (forgotten after the longer of the lease and the transfer timeout). */
  releasedAtMs?: number;
}

const PRODUCER_TRANSITIONS = {
  held: ['draining'],
  'released-early': ['draining'],
  draining: ['released'],
  released: [],
} as const;
/** Releases of unknown transfers kept at most (stale ones are forgotten first, then the oldest). */
export const EARLY_RELEASES_MAX = 1024;

export class Producer {
  private readonly transfers = new TransferTable<ProducerState, HeldTransfer>(
    'producer',
    PRODUCER_TRANSITIONS,
    1 << 20,
  );

  /** Requests of ended leases whose pages the NIC no longer reads (expire), reported by takeFinished. */
  private drained: string[] = [];

  constructor(
    private readonly ctx: WorkerContext,
    private readonly onActivity: () => void = () => {},
  ) {}

  /** Leases that ended (transfer id → request id): revoke, wait for the NIC to let go, then report. */
  expire(expiring: Record<string, string>): void {
    for (const [transferId, requestId] of Object.entries(expiring)) {
      // A release's drain under way (or just ended, not yet reported): this one reports the request, once.
      const state = this.transfers.get(transferId)?.state;
      if (state === 'draining' || state === 'released') this.transfers.drop(transferId);
      this.ctx.transfer.revokeGrant(transferId);
      // Mutant lease-no-drain: the pages are reported while a READ admitted under the grant may still run.
      const drained = this.ctx.mutations.drainEndedLeases
        ? this.ctx.transfer.drainGrant(transferId)
        : Promise.resolve();
      void drained.then(() => {
        this.drained.push(requestId);
        this.onActivity();
      });
    }
  }

  /**
   * This step's metadata: every held transfer (transfer id → request id); ended leases come to expire.
   * `contradicted`: a release that came before its transfer was held but that a peer has contradicted since
   * (WRITE: a decode said where to write): it is dropped and the transfer stays held.
   */
  bind(sendTransfers: Record<string, string>, contradicted: (transferId: string) => boolean = () => false): void {
    // One pass: holds that ended, and early releases of transfers not held here within staleBeforeMs.
    const stale = this.ctx.staleBeforeMs();
    for (const [transferId, t] of [...this.transfers.entries()]) {
      if (t.state === 'held' && sendTransfers[transferId] === undefined) this.transfers.drop(transferId);
      else if (t.state === 'released-early' && (t.releasedAtMs ?? 0) < stale) this.transfers.drop(transferId);
    }
    for (const [transferId, requestId] of Object.entries(sendTransfers)) {
      const t = this.transfers.get(transferId);
      if (t !== undefined && t.state === 'released-early' && contradicted(transferId)) {
        this.ctx.log?.warn(
          { transferId },
          'release that came before the transfer, contradicted by its destination, dropped',
        );
        this.transfers.drop(transferId);
        this.transfers.add(transferId, { state: 'held', requestId });
      } else if (t === undefined) this.transfers.add(transferId, { state: 'held', requestId });
      else if (t.state === 'released-early') {
        t.requestId = requestId;
        this.drain(transferId, t);
      }
    }
  }

  /** Releases kept for transfers not held here (yet). */
  get numReleasedEarly(): number {
    return this.transfers.inState('released-early').length;
  }

  /** Whether `transferId` is held for its peer (not released: its pages are not being reported free). */
  isHeld(transferId: string): boolean {
    return this.transfers.get(transferId)?.state === 'held';
  }

  /** The peer read (or gave up on) the pages: they may be freed; the grant dies now. */
  released(transferId: string): void {
    this.ctx.transfer.revokeGrant(transferId);
    const t = this.transfers.get(transferId);
    if (t?.state === 'held') return this.drain(transferId, t);
    if (t !== undefined) return; // a duplicate release
    this.forgetStaleReleases();
    // At the bound the oldest goes first: dropping them all held the pages of transfers released early to
    // their lease.
    const oldest = this.transfers.oldestIn('released-early');
    if (oldest !== undefined && this.numReleasedEarly >= EARLY_RELEASES_MAX) this.transfers.drop(oldest[0]);
    this.transfers.add(transferId, { state: 'released-early', requestId: null, releasedAtMs: this.ctx.env.nowMs() });
  }

  /**
   * A release whose transfer was not held here by staleBeforeMs belongs to a request that never finished
   * here (aborted, refused, never came): it is forgotten, so it neither stays for the life of the process
   * nor frees a later transfer under the same id (bind does the same in its pass at each step).
   */
  private forgetStaleReleases(): void {
    const stale = this.ctx.staleBeforeMs();
    for (const [id, t] of this.transfers.inState('released-early'))
      if ((t.releasedAtMs ?? 0) < stale) this.transfers.drop(id);
  }

  /** Released: once the NIC no longer reads the pages (the grant is revoked), they may be reported. */
  private drain(transferId: string, t: HeldTransfer): void {
    this.transfers.move(transferId, 'draining');
    void this.ctx.transfer.drainGrant(transferId).then(() => {
      // Still this transfer (a lease's end or the next transfer under the id did not take its place).
      if (this.transfers.get(transferId) !== t || t.state !== 'draining') return;
      this.transfers.move(transferId, 'released');
      this.onActivity();
    });
  }

  /** Requests whose pages may be freed now (vLLM's get_finished, sending side). */
  takeFinished(): string[] {
    const drained = this.drained;
    this.drained = [];
    return [...drained, ...this.transfers.take('released').map(([, t]) => t.requestId as string)];
  }
}
