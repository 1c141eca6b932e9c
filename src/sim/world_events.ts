/**
 * What the world does with each network event of the fabric:
 *   - feeds both instances' page lifecycles (READ: destination pages inbound on the poster, source
 *     pages outbound on the peer; WRITE the other way round; grants on the granting side);
 *   - checks I5 ("transfer done" only once the destination has the data): a write_done may be sent
 *     only after every WRITE of its transfer landed and its poster observed it, and must not reach
 *     the destination before the data; a READ consumer's release (its "done" to the producer) only
 *     after every READ of its transfer ended;
 *   - checks the request half of I7 (ownership epochs): a transfer posted for request R may write only
 *     pages no other live request owns (the lifecycle binds it to the pages' generation); a WRITE posted
 *     under a grant the destination already ended is exempt: its NIC refuses it (the lifecycle flags
 *     it if it lands after all);
 *   - offers scenario actions and injects faults at a READ's post (abort it, kill the prefill, slow it),
 *     and the abort scenario's abort from decode's WRITE grant on (decode awaits prefill's WRITE);
 *   - records NIC slices and maps race-checker work-request ids to them for the trace.
 */
import type { PageSpan } from '../device/types.ts';
import type { RaceReport } from '../device/race/race_report.ts';
import type { WireRange } from '../transfer/core/ranges.ts';
import type { FabricEvent, FabricItem } from '../transfer/sim/sim_fabric.ts';
import { SIM_TRANSFER_TIMEOUT_MS } from './scenarios.ts';
import type { SimInstance } from './instance.ts';
import type { ProxyRequest } from './proxy.ts';
import type { SimWorld } from './world.ts';

interface Pages {
  local: number[];
  remote: number[];
  /** The bytes written at the destination (local for a READ, remote for a WRITE), per page. */
  dstSpans: PageSpan[];
}

export class WorldEvents {
  private readonly pages = new Map<number, Pages>();
  /** `${posterEngineId}|${transferId}` → WRITE items posted, landed, observed by the poster. */
  private readonly writes = new Map<string, { posted: Set<number>; landed: Set<number>; observed: Set<number> }>();
  /** `${posterEngineId}|${transferId}` → READs posted and not ended yet. */
  private readonly reads = new Map<string, Set<number>>();
  /** `${posterEngineId}|${transferId}` whose "done" went out (write_done sent, release sent): no post may follow. */
  private readonly announced = new Map<string, 'write_done' | 'release'>();
  /** `${instance}:${race-checker work request id}` → fabric item id. */
  private readonly rcItems = new Map<string, number>();

  constructor(private readonly w: SimWorld) {}

  /** The pages (and the byte spans inside each) that ranges of an instance with `pageBytes` pages touch. */
  private spansOf(ranges: readonly WireRange[], pageBytes: number): PageSpan[] {
    const out: PageSpan[] = [];
    for (const r of ranges) {
      for (let b = Math.floor(r.offset / pageBytes); b <= Math.floor((r.offset + r.length - 1) / pageBytes); b++) {
        const start = Math.max(r.offset, b * pageBytes) - b * pageBytes;
        const end = Math.min(r.offset + r.length, (b + 1) * pageBytes) - b * pageBytes;
        out.push({ slab: r.slab, block: b, start, end });
      }
    }
    return out;
  }

  private pagesOf(spans: readonly PageSpan[]): number[] {
    return [...new Set(spans.map((s) => s.block))].sort((a, b) => a - b);
  }

  handle(ev: FabricEvent): void {
    switch (ev.t) {
      case 'post':
        return this.posted(ev.item, ev.rcId, ev.local, ev.remote);
      case 'land':
      case 'fail':
        return this.ended(ev.item, ev.t === 'land');
      case 'observed': {
        const rec = [...this.writes.values()].find((x) => x.posted.has(ev.itemId));
        rec?.observed.add(ev.itemId);
        return;
      }
      case 'grant': {
        const inst = this.w.instanceOf(ev.engineId);
        // A consumer's grant lets the producer WRITE its pages; a producer's lets the consumer READ them.
        const peerWrites = inst?.spec.role === 'consumer';
        inst?.lifecycle.grant(ev.transferId, ev.blockIds, ev.change === 'issued', peerWrites);
        // WRITE: from its grant on, decode waits for prefill's WRITE; the abort scenario may strike then.
        const target = this.w.proxy.requests.find((q) => q.transferId === ev.transferId);
        if (peerWrites && ev.change === 'issued' && target?.spec.index === this.w.scenario.abortTarget)
          this.offerAbort(target, () => true);
        this.w.trace?.instant({
          process: inst?.name ?? ev.engineId,
          lane: 'host',
          name: `grant ${ev.change} ${ev.transferId}`,
          atMs: this.w.env.nowMs(),
          args: { blocks: ev.blockIds },
        });
        return;
      }
      case 'notify-send':
        if (ev.notification.type === 'write_done') this.checkWriteDone(ev.item, 'sent', true);
        if (ev.notification.type === 'release') this.checkRelease(ev.item);
        if (ev.notification.type === 'write_done' || ev.notification.type === 'release')
          this.announced.set(`${ev.item.from}|${ev.notification.transferId}`, ev.notification.type);
        return;
      case 'notify-deliver':
        if (ev.notification.type === 'write_done' && ev.delivered) this.checkWriteDone(ev.item, 'delivered', false);
        return;
      case 'engine-closed':
        return;
    }
  }

  private posted(item: FabricItem, rcId: number | null, localRanges: WireRange[], remoteRanges: WireRange[]): void {
    const poster = this.w.instanceOf(item.from);
    const peer = this.w.instanceOf(item.to);
    if (poster === null || peer === null) return;
    // Each side's offsets are in its own pages: the two sides' page sizes differ with their block sizes.
    const local = this.spansOf(localRanges, poster.kvConfig.pageBytes);
    const remote = this.spansOf(remoteRanges, peer.kvConfig.pageBytes);
    const p: Pages = {
      local: this.pagesOf(local),
      remote: this.pagesOf(remote),
      dstSpans: item.kind === 'read' ? local : remote,
    };
    this.pages.set(item.id, p);
    // I5 for what was not posted yet: a "done" already sent for this transfer covered only what was posted then.
    const done = this.announced.get(`${item.from}|${item.transferId}`);
    if (done !== undefined)
      this.w.violate(
        'lifecycle',
        `I5: ${item.kind.toUpperCase()} net#${item.id} of ${item.transferId} posted after its ${done} was sent: the "done" did not cover it`,
        'I5',
      );
    if (rcId !== null) this.rcItems.set(`${poster.name}:${rcId}`, item.id);
    const owner = this.checkOwner(
      item,
      item.kind === 'read' ? poster : peer,
      item.kind === 'read' ? p.local : p.remote,
    );
    if (item.kind === 'read') {
      poster.lifecycle.inboundPosted(item.id, p.local, 'self', owner);
      peer.lifecycle.outboundPosted(item.id, p.remote);
      const key = `${item.from}|${item.transferId}`;
      this.reads.set(key, (this.reads.get(key) ?? new Set()).add(item.id));
    } else {
      poster.lifecycle.outboundPosted(item.id, p.local);
      peer.lifecycle.inboundPosted(item.id, p.remote, 'peer', owner, item.transferId);
      const key = `${item.from}|${item.transferId}`;
      const rec = this.writes.get(key) ?? { posted: new Set(), landed: new Set(), observed: new Set() };
      rec.posted.add(item.id);
      this.writes.set(key, rec);
    }
    this.w.trace?.instant({
      process: poster.name,
      lane: 'host',
      name: `post ${item.kind} net#${item.id}`,
      atMs: this.w.env.nowMs(),
      args: { transferId: item.transferId, local: p.local, remote: p.remote },
    });
    this.offerActions(item);
  }

  private ended(item: FabricItem, landed: boolean): void {
    const p = this.pages.get(item.id);
    this.pages.delete(item.id);
    if (item.kind === 'read') this.reads.get(`${item.from}|${item.transferId}`)?.delete(item.id);
    const poster = this.w.instanceOf(item.from);
    const peer = this.w.instanceOf(item.to);
    if (p === undefined || poster === null || peer === null) return;
    const [dst, dstPages, src, srcPages] =
      item.kind === 'read' ? [poster, p.local, peer, p.remote] : [peer, p.remote, poster, p.local];
    dst.lifecycle.inboundDone(item.id, dstPages, landed, p.dstSpans);
    if (landed) src.lifecycle.outboundRan(item.id, srcPages);
    else src.lifecycle.outboundDone(item.id, srcPages);
    if (item.kind === 'write' && landed) this.writes.get(`${item.from}|${item.transferId}`)?.landed.add(item.id);
  }

  /** I5: "done" derives from the data plane at the destination, never the sender's hope. */
  private checkWriteDone(item: FabricItem, when: 'sent' | 'delivered', needObserved: boolean): void {
    const rec = this.writes.get(`${item.from}|${item.transferId}`);
    if (rec === undefined) return;
    const notLanded = [...rec.posted].filter((id) => !rec.landed.has(id));
    const notSeen = needObserved
      ? [...rec.posted].filter((id) => !rec.observed.has(id) && !notLanded.includes(id))
      : [];
    if (notLanded.length > 0)
      this.w.violate(
        'lifecycle',
        `I5: write_done for ${item.transferId} ${when} while WRITE ${notLanded.map((i) => `net#${i}`).join(',')} has not landed at the destination`,
        'I5',
      );
    else if (notSeen.length > 0)
      this.w.violate(
        'lifecycle',
        `I5: write_done for ${item.transferId} ${when} before the producer observed WRITE ${notSeen.map((i) => `net#${i}`).join(',')} complete`,
        'I5',
      );
  }

  /**
   * I7, the request half: the destination pages must not belong to another live request now (pages held
   * behind a fence belong to none). Returns the destination request's id, which the lifecycle records.
   */
  private checkOwner(item: FabricItem, dst: SimInstance, blocks: readonly number[]): string {
    const r = this.requestOf(item);
    if (r === undefined || !dst.alive) return '';
    const refused =
      item.kind === 'write' && item.transferId !== null && !dst.lifecycle.writeGrantLive(item.transferId, blocks);
    const idOf = (q: ProxyRequest): string =>
      dst.spec.role === 'consumer' ? this.w.proxy.decodeId(q) : this.w.proxy.prefillId(q);
    const owner = idOf(r);
    const mine = new Set(dst.engine.kv.getBlockIds(owner).flat());
    for (const q of this.w.proxy.requests) {
      if (q === r) continue;
      const taken = dst.engine.kv
        .getBlockIds(idOf(q))
        .flat()
        .filter((b) => blocks.includes(b) && !mine.has(b));
      if (taken.length > 0 && !refused)
        this.w.violate(
          'lifecycle',
          `I7: ${dst.name} blocks ${taken.join(',')}: ${item.kind.toUpperCase()} net#${item.id} posted for ${owner} writes pages owned by ${idOf(q)} (a stale writer)`,
          'I7',
        );
    }
    return owner;
  }

  /** I5 for READ: the release tells the producer it may free the source: every READ must have ended. */
  private checkRelease(item: FabricItem): void {
    const open = [...(this.reads.get(`${item.from}|${item.transferId}`) ?? [])];
    if (open.length > 0)
      this.w.violate(
        'lifecycle',
        `I5: release for ${item.transferId} sent while READ ${open.map((i) => `net#${i}`).join(',')} has not landed at the destination`,
        'I5',
      );
  }

  private requestOf(item: FabricItem): ProxyRequest | undefined {
    const index = Number((item.label.requestIds?.[0] ?? '').slice(2));
    return Number.isInteger(index) ? this.w.proxy.requests[index] : undefined;
  }

  /** Requests whose decode READ comes late too (fault late-answer): the NIC starts it a few ms after its post. */
  readonly lateReads = new Set<number>();

  /**
   * Prefill's READ answer reaches the proxy at once, or (fault late-answer: a congested proxy and link) just
   * before its lease ends, and decode's READ is slow to start: it may still be under way when the lease ends
   * (a lease end that frees the pages without waiting for the drain was never caught before, session 11).
   */
  answerArrives(r: ProxyRequest, deliver: () => void): void {
    if (this.w.scenario.mode !== 'read' || !this.w.buggify.fire('late-answer', 0.5)) return deliver();
    const leaseMs = this.w.scenario.prefill.connector.leaseMs;
    this.lateReads.add(r.spec.index);
    this.w.env.setTimer(leaseMs - 1 - this.w.buggify.int(6, 'late-answer'), () => {
      this.w.trace?.instant({
        process: 'proxy',
        lane: 'proxy',
        name: `request ${r.spec.index}: late answer arrives`,
        atMs: this.w.env.nowMs(),
        args: {},
      });
      deliver();
    });
  }

  /** Scenario actions and faults that become possible once a transfer is in flight. */
  private offerActions(item: FabricItem): void {
    const w = this.w;
    const r = this.requestOf(item);
    const index = r?.spec.index ?? -1;
    const inFlight = (): boolean => w.fabric.has(item.id);
    // A slow NIC: a READ, or a WRITE (its producer's wait times out and aborts it), may come late.
    if ((item.kind === 'read' || item.kind === 'write') && w.buggify.fire('slow-read')) {
      item.notBeforeMs = w.env.nowMs() + (w.buggify.int(2) === 0 ? 1.5 * SIM_TRANSFER_TIMEOUT_MS : 5);
    }
    if (item.kind === 'read' && this.lateReads.delete(index))
      item.notBeforeMs = w.env.nowMs() + 2 + w.buggify.int(8, 'late-answer');
    const abortHere = r !== undefined && (w.scenario.abortTarget === index || w.buggify.fire('abort-mid-transfer'));
    if (abortHere) this.offerAbort(r, inFlight);
    const peer = w.instanceOf(item.to); // a READ's producer (1P1D: P)
    const kill =
      item.kind === 'read' &&
      peer !== null &&
      peer.alive &&
      (w.scenario.killPrefillMidRead || w.buggify.fire('kill-peer', 0.1));
    if (kill && !w.actions.has(`act:kill:${peer.name}`)) {
      w.addAction({
        key: `act:kill:${peer.name}`,
        name: 'kill prefill',
        enabled: () => inFlight() && peer.alive,
        run: () => {
          peer.kill();
          w.proxy.instanceDied(peer);
        },
      });
    }
  }

  /** The client may abort request `r` while `live()` (its transfer is in flight, or decode awaits its WRITE). */
  private offerAbort(r: ProxyRequest, live: () => boolean): void {
    const key = `act:abort:${r.spec.index}`;
    if (this.w.actions.has(key)) return;
    this.w.addAction({
      key,
      name: `abort request ${r.spec.index}`,
      enabled: () => live() && r.phase !== 'done',
      run: () => this.w.proxy.abort(r),
    });
  }

  /** Highlight a race's two accesses in the trace. */
  markRace(instance: string, r: RaceReport, blocks: number[]): void {
    // The checker numbers ops as the device does, except rank parts (TP > 1): those are not highlighted.
    const ranked = (this.w.instances.find((i) => i.name === instance)?.device.ranks ?? 1) > 1;
    const keyOf = (x: RaceReport['a']): string | null => {
      if (x.source === 'op') return ranked ? null : `${instance}.op#${x.id}`;
      if (x.source === 'nic') {
        const item = this.rcItems.get(`${instance}:${x.id}`);
        return item === undefined ? null : `net#${item}`;
      }
      return null;
    };
    const who = (x: RaceReport['a']): string =>
      `${x.write ? 'write' : 'read'} by ${x.label.what}${x.label.requestIds?.length ? ` (${x.label.requestIds.join(',')})` : ''}${x.label.step === undefined ? '' : ` step ${x.label.step}`}`;
    this.w.trace?.markRace(
      keyOf(r.a),
      keyOf(r.b),
      `${instance}: ${who(r.a)} unordered with ${who(r.b)} on blocks ${blocks.join(',')}`,
    );
  }
}
