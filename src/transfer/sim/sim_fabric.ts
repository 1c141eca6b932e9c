/**
 * The simulated network of the `sim` transfer backend: one queue of everything that crosses between
 * engines (one-sided READ/WRITE work requests, notifications, handshakes). Nothing in the queue moves
 * on its own: the simulator's explorer picks an item and runs it, so every ordering of NIC traffic
 * against the compute streams can be forced and replayed. With `autoRun` (tests, the conformance
 * suite) enabled items run in queue order at the next microtask.
 *
 *   engine A --postRead--> [ fabric queue: wr#1 notify#2 wr#3 ... ] --run(id)--> copy / deliver
 *                                 ^ explorer picks one (enabled(): notBeforeMs <= now)
 *
 * Observers see every event (post, land, fail, notify, grant) so the simulator's oracles can follow
 * each page's life without touching the engines.
 */
import { assert } from '../../util/assert.ts';
import type { HandoffError } from '../../util/errors.ts';
import type { OpLabel } from '../../device/types.ts';
import type { WireRange } from '../core/ranges.ts';
import type { Notification } from '../core/types.ts';

export type FabricItemKind = 'read' | 'write' | 'notify' | 'handshake';

/** A fault the explorer may apply when it runs an item (BUGGIFY sites of the network). */
export type FabricFault = 'fail' | 'drop' | 'duplicate';

export interface FabricItem {
  readonly id: number;
  readonly kind: FabricItemKind;
  /** Engine that initiated it (the poster of a work request, the sender of a notification). */
  readonly from: string;
  readonly to: string;
  readonly label: OpLabel;
  readonly bytes: number;
  readonly transferId: string | null;
  /** The item is not enabled before this virtual time (a slow NIC). */
  notBeforeMs: number;
  /** Apply the item's effect; `fault` as chosen by the explorer. */
  run(fault: FabricFault | null): void;
  /** Remove it without effect (peer gone, abort), settling whatever waits on it with `err`. */
  cancel(err: HandoffError): void;
}

/** What the oracles see. Ranges are page byte ranges: `local` on `from`, `remote` on `to`. */
export type FabricEvent =
  | { t: 'post'; item: FabricItem; rcId: number | null; local: WireRange[]; remote: WireRange[] }
  | { t: 'land'; item: FabricItem }
  | { t: 'fail'; item: FabricItem; code: string }
  | { t: 'observed'; engineId: string; itemId: number }
  | { t: 'notify-send'; item: FabricItem; notification: Notification }
  | { t: 'notify-deliver'; item: FabricItem; notification: Notification; delivered: boolean }
  | {
      t: 'grant';
      engineId: string;
      change: 'issued' | 'revoked' | 'expired' | 'released';
      transferId: string;
      blockIds: number[];
      peerEngineId: string | null;
    }
  | { t: 'engine-closed'; engineId: string };

/** Items queued at once (CONVENTIONS: bound every queue). */
export const FABRIC_QUEUE_MAX = 65_536;

export class SimFabric {
  private readonly items = new Map<number, FabricItem>();
  private readonly observers = new Set<(ev: FabricEvent) => void>();
  private nextId = 1;
  private autoQueued = false;

  /** autoRun: items run by themselves at the next microtask (delayed items are queued only once due). */
  constructor(readonly autoRun: boolean) {}

  newItemId(): number {
    return this.nextId++;
  }

  enqueue(item: FabricItem): void {
    assert(!this.items.has(item.id), `fabric item ${item.id} queued twice`);
    assert(this.items.size < FABRIC_QUEUE_MAX, `fabric queue holds ${FABRIC_QUEUE_MAX} items`);
    this.items.set(item.id, item);
    this.kick();
  }

  /** Every queued item, in id order. */
  queued(): FabricItem[] {
    return [...this.items.values()];
  }

  /** Items that may run at virtual time `nowMs`, in id order. */
  enabled(nowMs: number): FabricItem[] {
    return this.queued().filter((i) => i.notBeforeMs <= nowMs);
  }

  /** The earliest time a delayed item becomes enabled, or null. */
  nextEnabledMs(nowMs: number): number | null {
    let best: number | null = null;
    for (const i of this.items.values())
      if (i.notBeforeMs > nowMs && (best === null || i.notBeforeMs < best)) best = i.notBeforeMs;
    return best;
  }

  has(id: number): boolean {
    return this.items.has(id);
  }

  /** Run queued item `id` now (removing it first, so a re-entrant enqueue sees a consistent queue). */
  run(id: number, fault: FabricFault | null = null): void {
    const item = this.items.get(id);
    assert(item !== undefined, `fabric item ${id} is not queued`);
    this.items.delete(id);
    item.run(fault);
  }

  /** Take item `id` out of the queue without running it; returns it, or null when it is not queued. */
  remove(id: number): FabricItem | null {
    const item = this.items.get(id);
    if (item === undefined) return null;
    this.items.delete(id);
    return item;
  }

  /** Cancel every queued item that `pred` selects. */
  cancelWhere(pred: (i: FabricItem) => boolean, err: HandoffError): void {
    for (const item of this.queued()) {
      if (!pred(item)) continue;
      this.items.delete(item.id);
      item.cancel(err);
    }
  }

  onEvent(fn: (ev: FabricEvent) => void): () => void {
    this.observers.add(fn);
    return () => this.observers.delete(fn);
  }

  emit(ev: FabricEvent): void {
    for (const fn of this.observers) fn(ev);
  }

  /** autoRun: run every queued item, in id order, at the next microtask. */
  private kick(): void {
    if (!this.autoRun || this.autoQueued) return;
    this.autoQueued = true;
    queueMicrotask(() => {
      this.autoQueued = false;
      for (const item of this.queued()) if (this.items.has(item.id)) this.run(item.id);
    });
  }
}
