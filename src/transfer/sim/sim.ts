/**
 * `sim` backend: the transfer engine core (core/transfer_engine.ts) with the simulator's NIC (sim_nic.ts)
 * and a side channel on the same SimFabric (sim_fabric.ts). Work requests, notifications and
 * handshakes are all fabric items, so the explorer decides when (and whether) each one arrives.
 *
 *   D.postRead ──> core ──> SimNic ──> fabric [wr] ──run──> P's grants ──> copy P slab -> D slab ──> cq
 *   D.notify   ──> core ──> fabric [msg] ──run──> P handlers, then D's notify() resolves (the ack)
 *
 * Same contract as inproc/tcp (testing/conformance.ts), and the same grant, notify and timeout code (the
 * core's). Addresses are `sim://<engineId>`; engines find each other through their fabric.
 */
import { assert } from '../../util/assert.ts';
import { HandoffError } from '../../util/errors.ts';
import { localHandshakeRefusal } from '../core/metadata.ts';
import { SimFabric, type FabricItem } from './sim_fabric.ts';
import { SimNic } from './sim_nic.ts';
import { TransferEngineCore, type TransferEngineCoreOptions } from '../core/transfer_engine.ts';
import type { EngineMetadata, Notification, PeerAddress, TransferEngineOptions } from '../core/types.ts';

const SCHEME = 'sim://';

/** Engines created through createTransferEngine share this auto-running fabric (tests, conformance). */
const defaultFabric = new SimFabric(true);
const registries = new WeakMap<SimFabric, Map<string, SimTransferEngine>>();

function registryOf(f: SimFabric): Map<string, SimTransferEngine> {
  let r = registries.get(f);
  if (r === undefined) registries.set(f, (r = new Map()));
  return r;
}

export interface SimTransferEngineOptions extends TransferEngineCoreOptions {
  fabric: SimFabric;
  /** Views of the registered slabs (a sim device's slabs, or views of SharedArrayBuffers). */
  slabViews: Uint8Array[];
}

export class SimTransferEngine extends TransferEngineCore<SimNic> {
  readonly backend = 'sim' as const;
  readonly fabric: SimFabric;

  /** The factory's path: an engine on the shared auto-running fabric over SharedArrayBuffer slabs. */
  static async create(opts: TransferEngineOptions): Promise<SimTransferEngine> {
    const { backend: _backend, slabs, ...rest } = opts;
    return new SimTransferEngine({ ...rest, fabric: defaultFabric, slabViews: slabs.map((b) => new Uint8Array(b)) });
  }

  constructor(opts: SimTransferEngineOptions) {
    const registry = registryOf(opts.fabric);
    if (registry.has(opts.engineId)) throw new HandoffError('BAD_CONFIG', `sim engine ${opts.engineId} already exists`);
    const { numSlabs, numBlocks, pageBytes } = opts.layout;
    assert(opts.slabViews.length === numSlabs, `expected ${numSlabs} slabs, got ${opts.slabViews.length}`);
    assert(
      opts.slabViews.every((s) => s.byteLength === numBlocks * pageBytes),
      'every slab is numBlocks x pageBytes',
    );
    const nic = new SimNic({
      engineId: opts.engineId,
      env: opts.env,
      fabric: opts.fabric,
      layout: opts.layout,
      slabs: opts.slabViews,
      slotsMax: opts.inflightMax ?? 1024,
    });
    super(opts, nic);
    this.fabric = opts.fabric;
    nic.reach = (to) => this.reachableNic(to);
    registry.set(this.engineId, this);
  }

  /** The simulator's leak oracle: completion-queue slots still taken (0 once every work request settled). */
  get nicSlotsTaken(): number {
    return this.nic.slotsTaken;
  }

  address(): PeerAddress {
    return { host: `${SCHEME}${this.engineId}`, port: 0 };
  }

  ports(): { sideChannel: number; data: number } {
    return { sideChannel: 0, data: 0 };
  }

  /** The peer's NIC when a work request between us can run now: both open and shaken hands. */
  private reachableNic(to: string): SimNic | null {
    const remote = registryOf(this.fabric).get(to);
    if (this.isClosed || remote === undefined || remote.isClosed || !remote.peers.has(this.engineId)) return null;
    return remote.nic;
  }

  // ---- side channel: handshakes and notifications are fabric items too ----

  protected handshakeImpl(peer: PeerAddress): Promise<EngineMetadata> {
    if (!peer.host.startsWith(SCHEME))
      return Promise.reject(new HandoffError('PEER_UNAVAILABLE', `${peer.host} is not a sim address`));
    const to = peer.host.slice(SCHEME.length);
    return new Promise<EngineMetadata>((resolve, reject) => {
      const item: FabricItem = {
        id: this.fabric.newItemId(),
        kind: 'handshake',
        from: this.engineId,
        to,
        label: { what: 'handshake' },
        bytes: 0,
        transferId: null,
        notBeforeMs: this.env.nowMs(),
        run: () => {
          try {
            resolve(this.completeHandshake(to));
          } catch (e) {
            reject(e); // catch-ok: settles handshake(), which rethrows it to the caller (assertions included)
          }
        },
        cancel: (err) => reject(err),
      };
      this.fabric.enqueue(item);
    });
  }

  private completeHandshake(to: string): EngineMetadata {
    const remote = registryOf(this.fabric).get(to);
    if (this.isClosed) throw new HandoffError('PEER_UNAVAILABLE', 'engine is closed');
    if (remote === undefined || remote.isClosed) throw new HandoffError('PEER_UNAVAILABLE', `no sim engine ${to}`);
    const refusal = localHandshakeRefusal(
      { secret: this.secret, metadata: this.metadata },
      { secret: remote.secret, metadata: remote.metadata },
    );
    if (refusal !== null) {
      remote.counters.handshakesRefused++;
      throw refusal;
    }
    this.peers.set(remote.engineId, remote.metadata);
    remote.peers.set(this.engineId, this.metadata);
    return remote.metadata;
  }

  protected sendNotification(to: string, n: Notification): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const make = (ack: boolean): FabricItem => {
        const item: FabricItem = {
          id: this.fabric.newItemId(),
          kind: 'notify',
          from: this.engineId,
          to,
          label: { what: `notify-${n.type}` },
          bytes: 0,
          transferId: n.transferId,
          notBeforeMs: this.env.nowMs(),
          run: (fault) => {
            const remote = registryOf(this.fabric).get(to);
            const reachable = remote !== undefined && !remote.isClosed && remote.peers.has(this.engineId);
            const delivered = reachable && fault !== 'drop';
            this.fabric.emit({ t: 'notify-deliver', item, notification: n, delivered });
            if (!reachable) return ack ? reject(new HandoffError('PEER_UNAVAILABLE', `peer ${to} is gone`)) : undefined;
            if (fault === 'drop') return; // lost: the sender's notify() times out
            if (fault === 'duplicate') this.fabric.enqueue(make(false));
            remote.deliver(this.engineId, structuredClone(n));
            if (ack) resolve();
          },
          cancel: (err) => (ack ? reject(err) : undefined),
        };
        return item;
      };
      const item = make(true);
      this.fabric.emit({ t: 'notify-send', item, notification: n });
      this.fabric.enqueue(item);
    });
  }

  /** Everything queued from or to this engine fails PEER_UNAVAILABLE, in queue order. */
  protected closeTransport(): void {
    const registry = registryOf(this.fabric);
    if (registry.get(this.engineId) === this) registry.delete(this.engineId);
    for (const other of registry.values()) other.peers.delete(this.engineId);
    this.peers.clear();
    const err = new HandoffError('PEER_UNAVAILABLE', `engine ${this.engineId} closed`);
    this.fabric.cancelWhere((i) => i.from === this.engineId || i.to === this.engineId, err);
  }
}
