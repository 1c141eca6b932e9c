/**
 * The engine scheduler's view of each request's KV transfers, one state machine per direction:
 *
 *   load (decode):  sync-loading(step) ──step processed──> removed       (a READ in the step's preForward)
 *                   async-loading ──finishedRecving──> recv-finished ──resumed──> removed   (WRITE mode)
 *   hold (prefill): held(pages) ──finishedSending──> removed (pages go behind the free fence)
 *
 * A load that fails, or a request that ends, drops its load; held pages come back only through
 * finishedSending (the connector answers for releases and leases).
 */
import { TransferTable } from '../connector/transfer_table.ts';

type LoadState = 'sync-loading' | 'async-loading' | 'recv-finished' | 'loaded';
interface Load {
  state: LoadState;
  /** sync-loading: the step whose preForward runs the READ. */
  step: number;
}
const LOAD_TRANSITIONS = {
  'sync-loading': ['loaded'],
  'async-loading': ['recv-finished'],
  'recv-finished': ['loaded'],
  loaded: [],
} as const;

type HoldState = 'held' | 'released';
interface Hold {
  state: HoldState;
  blocks: number[][];
}
const HOLD_TRANSITIONS = { held: ['released'], released: [] } as const;

export const REQUEST_TRANSFERS_MAX = 1 << 20;

export class RequestTransfers {
  private readonly loads = new TransferTable<LoadState, Load>('request load', LOAD_TRANSITIONS, REQUEST_TRANSFERS_MAX);
  private readonly holds = new TransferTable<HoldState, Hold>('request hold', HOLD_TRANSITIONS, REQUEST_TRANSFERS_MAX);

  /** Any transfer state under this request id (a new request must not reuse it yet). */
  has(requestId: string): boolean {
    return this.loads.has(requestId) || this.holds.has(requestId);
  }

  get numHeld(): number {
    return this.holds.size;
  }

  /** Pages (every group) held for a peer: the pool pressure a router weighs as load. */
  get numHeldPages(): number {
    let n = 0;
    for (const [, h] of this.holds.inState('held')) for (const ids of h.blocks) n += ids.length;
    return n;
  }

  syncLoadStarted(requestId: string, step: number): void {
    this.loads.add(requestId, { state: 'sync-loading', step });
  }
  asyncLoadStarted(requestId: string): void {
    this.loads.add(requestId, { state: 'async-loading', step: 0 });
  }
  /** True while the request's READ is unresolved (its pages must not be published yet). */
  isSyncLoading(requestId: string): boolean {
    return this.loads.get(requestId)?.state === 'sync-loading';
  }
  /** The sync loads that ran in `step`, now resolved (landed or failed: the caller knows which). */
  takeSyncLoadsOf(step: number): string[] {
    const ids = this.loads.inState('sync-loading').flatMap(([id, l]) => (l.step === step ? [id] : []));
    for (const id of ids) this.loads.move(id, 'loaded');
    this.loads.take('loaded');
    return ids;
  }
  /** The producer's WRITE landed (ignored for a request that no longer waits for it). */
  recvFinished(requestId: string): void {
    if (this.loads.get(requestId)?.state === 'async-loading') this.loads.move(requestId, 'recv-finished');
  }
  /** A parked request may resume when its WRITE landed; consumes that state. */
  takeRecvFinished(requestId: string): boolean {
    if (this.loads.get(requestId)?.state !== 'recv-finished') return false;
    this.loads.move(requestId, 'loaded');
    this.loads.delete(requestId);
    return true;
  }
  /** The load failed or the request ended: nothing more is expected of it. */
  dropLoad(requestId: string): void {
    this.loads.drop(requestId);
  }

  hold(requestId: string, blocks: number[][]): void {
    this.holds.add(requestId, { state: 'held', blocks });
  }
  /** The connector is done with a request's pages: they come back to the caller (null if not held). */
  release(requestId: string): number[][] | null {
    if (this.holds.get(requestId)?.state !== 'held') return null;
    this.holds.move(requestId, 'released');
    return this.holds.delete(requestId).blocks;
  }
}
