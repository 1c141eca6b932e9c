/**
 * inproc backend: engines of one process find each other in a module-level registry (address
 * "inproc://<engineId>"). Handshake checks the shared secret and compatibility both ways, then joins
 * the two NIC threads with a MessageChannel and hands each the other's slabs, once. The data path
 * is NIC thread to NIC thread (nic_inproc.ts); notifications are delivered on a later timer turn.
 */
import { MessageChannel } from 'node:worker_threads';
import { assert } from '../../util/assert.ts';
import { HandoffError } from '../../util/errors.ts';
import { packRanges } from '../core/ranges.ts';
import { localHandshakeRefusal } from '../core/metadata.ts';
import { NicHost } from '../nic/nic_host.ts';
import { TransferEngineCore } from '../core/transfer_engine.ts';
import type { EngineMetadata, Notification, PeerAddress, TransferEngineOptions, TransferRange } from '../core/types.ts';

const registry = new Map<string, InprocTransferEngine>();
const SCHEME = 'inproc://';

export class InprocTransferEngine extends TransferEngineCore<NicHost> {
  readonly backend = 'inproc' as const;
  private readonly linked = new Set<string>();
  private readonly slabs: SharedArrayBuffer[];

  private constructor(opts: TransferEngineOptions, nic: NicHost) {
    super(opts, nic);
    this.slabs = opts.slabs;
  }

  static async create(opts: TransferEngineOptions): Promise<InprocTransferEngine> {
    if (registry.has(opts.engineId))
      throw new HandoffError('BAD_CONFIG', `inproc engine ${opts.engineId} already exists`);
    const nic = await NicHost.start({
      kind: 'inproc',
      engineId: opts.engineId,
      layout: opts.layout,
      slabs: opts.slabs,
      slotsMax: opts.inflightMax ?? 1024,
      listenHost: '',
      dataPort: 0,
      dataFrameBytes: 0,
      recvDirectMinBytes: 0,
      scatterRecv: false,
      lanes: 1,
      laneMinBytes: 0,
    });
    if (registry.has(opts.engineId)) {
      await nic.close();
      throw new HandoffError('BAD_CONFIG', `inproc engine ${opts.engineId} already exists`);
    }
    const engine = new InprocTransferEngine(opts, nic);
    registry.set(opts.engineId, engine);
    return engine;
  }

  address(): PeerAddress {
    return { host: `${SCHEME}${this.engineId}`, port: 0 };
  }

  ports(): { sideChannel: number; data: number } {
    return { sideChannel: 0, data: 0 };
  }

  protected async handshakeImpl(peer: PeerAddress): Promise<EngineMetadata> {
    if (!peer.host.startsWith(SCHEME))
      throw new HandoffError('PEER_UNAVAILABLE', `${peer.host} is not an inproc address`);
    const remote = registry.get(peer.host.slice(SCHEME.length));
    if (remote === undefined || remote.isClosed)
      throw new HandoffError('PEER_UNAVAILABLE', `no inproc engine at ${peer.host}`);
    const refusal = localHandshakeRefusal(
      { secret: this.secret, metadata: this.metadata },
      { secret: remote.secret, metadata: remote.metadata },
    );
    if (refusal !== null) {
      remote.counters.handshakesRefused++;
      throw refusal;
    }
    if (!this.linked.has(remote.engineId) || !remote.linked.has(this.engineId)) {
      // NIC <-> NIC, and each engine straight to the other's NIC (direct_link.ts).
      const { port1, port2 } = new MessageChannel();
      const [toRemote, toThis] = [new MessageChannel(), new MessageChannel()];
      this.nic.send(
        {
          t: 'peer',
          peerEngineId: remote.engineId,
          inproc: { port: port1, slabs: remote.slabs, direct: toThis.port2 },
        },
        [port1, toThis.port2],
      );
      remote.nic.send(
        { t: 'peer', peerEngineId: this.engineId, inproc: { port: port2, slabs: this.slabs, direct: toRemote.port2 } },
        [port2, toRemote.port2],
      );
      this.nic.attachDirect(remote.engineId, toRemote.port1);
      remote.nic.attachDirect(this.engineId, toThis.port1);
      this.linked.add(remote.engineId);
      remote.linked.add(this.engineId);
    }
    this.peers.set(remote.engineId, remote.metadata);
    remote.peers.set(this.engineId, this.metadata);
    return remote.metadata;
  }

  protected sendNotification(peerEngineId: string, n: Notification): Promise<void> {
    const remote = registry.get(peerEngineId);
    if (remote === undefined || remote.isClosed || !remote.peers.has(this.engineId)) {
      return Promise.reject(new HandoffError('PEER_UNAVAILABLE', `inproc peer ${peerEngineId} is gone`));
    }
    return new Promise((resolve) => {
      this.env.setTimer(0, () => {
        remote.deliver(this.engineId, n);
        resolve();
      });
    });
  }

  /**
   * The bench's inproc baseline: `from`'s NIC thread (the one that serves our READs) copies `ranges` from
   * its slabs into ours with no protocol, timed on that thread (nic_inproc.ts rawCopyMs). Needs a handshake.
   */
  rawCopyMs(from: InprocTransferEngine, ranges: readonly TransferRange[]): Promise<number> {
    assert(this.linked.has(from.engineId), `rawCopyMs: no handshake with ${from.engineId}`);
    const cmd = { t: 'rawCopy' as const, peerEngineId: this.engineId, ranges: packRanges(ranges) };
    return from.nic.request(cmd, (ev) => (ev.t === 'rawCopied' ? ev.ms : undefined));
  }

  /** A peer closed: forget it (its NIC link closes by itself). */
  private peerGone(peerEngineId: string): void {
    this.peers.delete(peerEngineId);
    this.linked.delete(peerEngineId);
    this.nic.detachDirect(peerEngineId, `peer ${peerEngineId} is gone`);
    this.nic.send({ t: 'unpeer', peerEngineId });
  }

  protected async closeTransport(): Promise<void> {
    if (registry.get(this.engineId) === this) registry.delete(this.engineId);
    // Our NIC first: a copy it serves into a peer's pages must end before the peer learns we are gone
    // (it then fails that READ and may reuse the pages; the late bytes landed over them before).
    await this.nic.close();
    for (const id of this.linked) registry.get(id)?.peerGone(this.engineId);
    this.linked.clear();
    this.peers.clear();
  }
}
