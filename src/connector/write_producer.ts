/**
 * WRITE producer (prefill, WRITE mode): one transfer per finished request to push into decode's pages.
 *
 *   awaiting-destination ─remote_blocks─┐
 *                                       ├─> ready ──push──> pushing ──> pushed (finishedSending)
 *   awaiting-save ──────────save meta───┘
 *
 * The save (our pages are final) comes in the step metadata; the destination (decode's pages and its
 * grant) in a `remote_blocks` notification; either may come first. A push waits for the WRITE to land
 * and then announces `write_done` (a failed push is logged: decode's deadline makes it recompute).
 * A destination for a save this side already gave up (lease ended, released) is answered `write_refused`
 * at once: no push will come, so decode recomputes now rather than at its deadline.
 * Decode's block size may differ from ours: the push moves tokens, not pages (alignment.ts, token_map.ts).
 */
import { rethrowIfAssertion } from '../util/assert.ts';
import type { SaveReqMeta } from '../worker/connector_metadata.ts';
import type { TransferHandle } from '../transfer/core/types.ts';
import { HandoffError, isHandoffError } from '../util/errors.ts';
import { alignState, tokenRun, type TokenAlignment } from './alignment.ts';
import { TransferTable } from './transfer_table.ts';
import { checkPeerPages, type PeerGeometry, type TransferPlan, type WorkerContext } from './worker_context.ts';

export interface RemoteBlocks {
  fromEngineId: string;
  /** decode's pages per group, from the request's token 0, in decode's block size. */
  blockIds: number[][];
  skipBlocks: number;
  /** Tokens [skipBlocks * decode's block size, endToken) are to be written; null: all both sides hold. */
  endToken: number | null;
  grant: string;
}

type SaveState = 'awaiting-destination' | 'awaiting-save' | 'pushing' | 'pushed';
interface SaveTransfer {
  state: SaveState;
  save: SaveReqMeta | null;
  dest: RemoteBlocks | null;
  /** When the destination came, for one still awaiting its save (forgotten after the lease and the timeout). */
  destAtMs: number;
}

const SAVE_TRANSITIONS = {
  'awaiting-destination': ['pushing'],
  'awaiting-save': ['pushing'],
  pushing: ['pushed'],
  pushed: [],
} as const;
/**
 * Destinations announced for saves we do not have (yet) kept at most, the oldest dropped first. Most never
 * get one: prefill's request was aborted or refused, or its leg never came (the client left).
 */
export const ORPHAN_DESTINATIONS_MAX = 1024;
/** Transfers whose save was given up, remembered (oldest forgotten first) to refuse a late destination. */
export const ENDED_SAVES_MAX = 4096;

export class WriteProducer {
  private readonly saves = new TransferTable<SaveState, SaveTransfer>('WRITE producer', SAVE_TRANSITIONS, 1 << 16);
  stats = { writesPosted: 0 };
  /** Requests of expired leases with no push under way (expire), reported by takeFinished. */
  private expired: string[] = [];
  /** Transfers whose save was dropped unpushed (lease ended, released): a destination for one is refused. */
  private readonly ended = new Set<string>();

  constructor(
    private readonly ctx: WorkerContext,
    private readonly onActivity: () => void,
  ) {}

  get numPending(): number {
    return this.saves.size - this.saves.inState('awaiting-save').length;
  }

  /** Destinations decode announced for transfers this side has no save of (yet). */
  get numDestinationsWithoutSave(): number {
    return this.saves.inState('awaiting-save').length;
  }

  /** Our pages of a finished request are final. */
  save(s: SaveReqMeta): void {
    this.ended.delete(s.transferId);
    const t = this.saves.get(s.transferId);
    if (t?.state === 'awaiting-save') t.save = s;
    else if (t === undefined)
      this.saves.add(s.transferId, { state: 'awaiting-destination', save: s, dest: null, destAtMs: 0 });
  }

  /**
   * Saves still waiting for a destination whose pages the scheduler no longer holds (released by decode,
   * or the lease ended) are dropped: their pages may belong to another request now, so a late
   * destination must never be pushed from them (it becomes an orphan, bounded below).
   */
  prune(held: Record<string, string>): void {
    // One pass: saves whose hold ended, and destinations whose save did not come by staleBeforeMs.
    const stale = this.ctx.staleBeforeMs();
    for (const [transferId, t] of [...this.saves.entries()])
      if (t.state === 'awaiting-destination' ? held[transferId] === undefined : isStale(t, stale))
        this.endSave(transferId);
  }

  /**
   * A destination whose save has not come within the longer of the lease and the transfer timeout never
   * gets one that decode still waits for (prefill's request was aborted or refused, or never came): it
   * is given up like a save (decode, if still waiting, is told nothing will come). Before, each stayed
   * for the life of the process.
   */
  private forgetStaleDestinations(): void {
    const stale = this.ctx.staleBeforeMs();
    for (const [transferId, t] of this.saves.inState('awaiting-save')) if (isStale(t, stale)) this.endSave(transferId);
  }

  /**
   * Leases that ended (transfer id → request id): a save not being pushed is dropped and its request
   * reported (takeFinished) so the scheduler frees its pages; a push under way is reported when it ends.
   */
  expire(expiring: Record<string, string>): void {
    for (const [transferId, requestId] of Object.entries(expiring)) {
      const state = this.saves.get(transferId)?.state;
      if (state === 'pushing' || state === 'pushed') continue;
      this.endSave(transferId);
      this.expired.push(requestId);
    }
  }

  /**
   * Decode released the transfer without telling us where to write (it will never load): drop its save.
   * 'pushing': a push from its pages is under way (or just ended, not yet reported); the release
   * changes nothing, the push's end reports the request.
   */
  released(transferId: string): 'pushing' | 'not-pushing' {
    const state = this.saves.get(transferId)?.state;
    if (state === 'awaiting-destination') this.endSave(transferId);
    return state === 'pushing' || state === 'pushed' ? 'pushing' : 'not-pushing';
  }

  /** Whether a decode said where to write `transferId` (a push is due, under way, or done). */
  hasDestination(transferId: string): boolean {
    const t = this.saves.get(transferId);
    return t !== undefined && (t.dest !== null || t.state === 'pushing' || t.state === 'pushed');
  }

  /** Decode told us where to write. */
  destination(transferId: string, dest: RemoteBlocks): void {
    const t = this.saves.get(transferId);
    if (t?.state === 'awaiting-destination') t.dest = dest;
    else if (t === undefined && this.ended.has(transferId)) this.refuse(transferId, dest);
    else if (t === undefined) {
      this.forgetStaleDestinations();
      // The oldest first: dropping them all lost the destinations of requests still being computed here.
      const oldest = this.saves.oldestIn('awaiting-save');
      if (oldest !== undefined && this.numDestinationsWithoutSave >= ORPHAN_DESTINATIONS_MAX)
        this.saves.drop(oldest[0]);
      this.saves.add(transferId, { state: 'awaiting-save', save: null, dest, destAtMs: this.ctx.env.nowMs() });
    }
  }

  /** Push every save whose destination is known. */
  startReadySaves(): void {
    for (const [transferId, t] of [...this.saves.entries()]) {
      if (t.state === 'pushing' || t.state === 'pushed' || t.save === null || t.dest === null) continue;
      this.saves.move(transferId, 'pushing');
      void this.push(t.save, t.dest).finally(() => {
        this.saves.move(transferId, 'pushed');
        this.onActivity();
      });
    }
  }

  /** Requests whose pages were pushed (or whose push failed): they may be freed. */
  takeFinished(): string[] {
    const expired = this.expired;
    this.expired = [];
    return [...expired, ...this.saves.take('pushed').map(([, t]) => (t.save as SaveReqMeta).requestId)];
  }

  private async push(save: SaveReqMeta, dest: RemoteBlocks): Promise<void> {
    const { transfer, config } = this.ctx;
    const handles: TransferHandle[] = [];
    try {
      const peer = this.ctx.peerGeometry(dest.fromEngineId);
      // The peer's word: ids that are not its pages would become byte offsets the transfer engine asserts on.
      checkPeerPages(dest.blockIds, peer, dest.fromEngineId, 'remote_blocks.blockIds');
      this.stats.writesPosted++;
      // Several work requests when the ranges exceed what one carries (a long prompt between degrees).
      for (const { ranges, footprint } of this.ctx.workRequestsFor(this.plan(save, dest, peer), peer, false))
        handles.push(
          transfer.postWrite({
            peerEngineId: dest.fromEngineId,
            transferId: save.transferId,
            grantToken: dest.grant,
            ranges,
            label: { what: 'kv-write', requestIds: [save.requestId] },
            footprint: footprint.map((f) => ({ ...f, write: false })),
          }),
        );
      const writeDone = () =>
        transfer.notify(dest.fromEngineId, {
          type: 'write_done',
          transferId: save.transferId,
          payload: { grant: dest.grant },
        });
      if (!this.ctx.mutations.writeDoneAfterData) await writeDone(); // mutant: announced before the data is visible
      await transfer.wait(handles, config.transferTimeoutMs);
      if (this.ctx.mutations.writeDoneAfterData) await writeDone();
    } catch (e) {
      rethrowIfAssertion(e);
      this.ctx.log?.warn(
        { transferId: save.transferId, err: String(e) },
        isHandoffError(e) && e.code === 'GRANT_DENIED'
          ? 'KV WRITE refused: decode revoked its grant (its request went away or its load timed out)'
          : 'KV WRITE failed; decode will time out and recompute',
      );
      // Timed out or failed: the NIC may still be sending from our pages. They are reported (and freed)
      // only once it acknowledged that it stopped.
      if (handles.length > 0) await transfer.abort(handles);
      // Nothing more will be pushed: decode recomputes now rather than at its deadline (a refused grant
      // means decode already gave the load up).
      if (!isHandoffError(e) || e.code !== 'GRANT_DENIED') this.refuse(save.transferId, dest);
    }
  }

  /**
   * Token t of our pages goes to token t of decode's (block sizes may differ), from decode's prefix hit to
   * the end decode asked for, which must lie within what both sides' pages hold.
   */
  private plan(save: SaveReqMeta, dest: RemoteBlocks, peer: PeerGeometry): TransferPlan {
    const runs = save.localBlockIds.map((ids, g): TokenAlignment => {
      const [ours, theirs] = [ids, dest.blockIds[g] ?? []];
      if (g >= this.ctx.numAttnGroups) return alignState(ours, theirs.slice(-1));
      const oursBs = this.ctx.blockSizeOf(g);
      const theirsBs = peer.blockSizes[g] ?? 0;
      const held = Math.min(ours.length * oursBs, theirs.length * theirsBs);
      const end = dest.endToken ?? held;
      if (end > held)
        throw new HandoffError(
          'BAD_TRANSFER_PARAMS',
          `decode asked for tokens up to ${end}; the pages hold ${held} (ours: ${ours.length} of ${oursBs}, decode's: ${theirs.length} of ${theirsBs})`,
        );
      const ourSide = { blockIds: ours, blockSize: oursBs };
      return tokenRun(ourSide, { blockIds: theirs, blockSize: theirsBs }, dest.skipBlocks * theirsBs, end);
    });
    return {
      local: runs.map((r) => r.local),
      remote: runs.map((r) => r.remote),
      runs: runs.map((r) => [r.start, r.end]),
    };
  }

  /** A save given up unpushed: its pages go back, and a destination that comes for it later is refused. */
  private endSave(transferId: string): void {
    const dest = this.saves.get(transferId)?.dest ?? null;
    if (dest !== null) this.refuse(transferId, dest); // told where to write before the save was given up
    if (this.saves.get(transferId) !== undefined) this.saves.drop(transferId);
    this.ended.delete(transferId);
    if (this.ended.size >= ENDED_SAVES_MAX) this.ended.delete(this.ended.values().next().value as string);
    this.ended.add(transferId);
  }

  /** Tell decode at once that nothing will be pushed (its grant's token proves the notice is ours). */
  private refuse(transferId: string, dest: RemoteBlocks): void {
    this.ctx.log?.warn({ transferId, from: dest.fromEngineId }, 'destination for a save already given up: refused');
    const refused = { type: 'write_refused' as const, transferId, payload: { grant: dest.grant } };
    this.ctx.transfer.notify(dest.fromEngineId, refused).catch((e: unknown) => {
      if (!isHandoffError(e)) throw e;
      // The side channel to decode is gone: its deadline makes it recompute.
      this.ctx.log?.warn({ transferId, err: e.message }, 'could not refuse the destination');
    });
  }
}

/** A destination still waiting for its save that came before `staleBeforeMs` (WorkerContext.staleBeforeMs). */
function isStale(t: SaveTransfer, staleBeforeMs: number): boolean {
  return t.state === 'awaiting-save' && t.destAtMs < staleBeforeMs;
}
