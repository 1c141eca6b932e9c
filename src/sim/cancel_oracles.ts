/**
 * Oracles of cancellation and held pages (dynamo #13855, vLLM #50425, sglang #28651 and #33507), in
 * every scenario:
 *   lease   no page prefill held for a request outlives its lease: each page of a prefill answer is back
 *           in the pool (or allocated anew) by answer + lease + transfer timeout + LEASE_SLACK_MS (a READ
 *           or WRITE that began just before the lease ended holds the pages until it lands or its timeout
 *           aborts it; the NIC's pages are not ours to free while it may still send from them); checked
 *           after every step
 *   cancel  a client that went away after prefill answered (at whatever point) gets prefill's pages released
 *           by decode (its READ's release, pdFlow's releaseUnused, its abort; WRITE: its push), never left
 *           to the lease: freed within CANCEL_RELEASE_MS of the cancel, unless a fault dropped a
 *           notification of that transfer or the lease came first;
 *           a cancelled request never reports success with partial output;
 *           under kv_load_failure_policy 'fail', a request one of whose READ/WRITE failed never reports
 *           success (no 200 over a cut transfer; under 'recompute' P/D == colocated judges the output)
 * Decode's pages after a cancel are judged by the end-of-run leak oracle (every page back, both sides).
 */
import type { FabricEvent } from '../transfer/sim/sim_fabric.ts';
import type { CancelPoints } from './cancel_points.ts';
import { SIM_LEASE_MS, SIM_TRANSFER_TIMEOUT_MS, type CancelPoint } from './scenarios.ts';
import type { SimWorld } from './world.ts';

/**
 * After the lease (and after the timeout of a transfer still under way when it ended): the NIC's abort
 * acknowledgement and the engine steps until the sweep frees the pages (idle polls, a forward).
 */
export const LEASE_SLACK_MS = 100;
/** How long past answer + lease a page may stay held at most: an in-flight transfer's timeout, then slack. */
export const LEASE_HOLD_MS = SIM_LEASE_MS + SIM_TRANSFER_TIMEOUT_MS + LEASE_SLACK_MS;
/** Release after a cancel: proxy → decode → empty READ → release notification → prefill frees. */
export const CANCEL_RELEASE_MS = SIM_LEASE_MS / 2;

interface HeldPage {
  index: number;
  allocation: number;
  deadlineMs: number;
}

export class CancelOracles {
  /** Prefill page → the latest answer that lent it to decode. */
  private readonly held = new Map<number, HeldPage>();
  private readonly answered = new Set<number>();
  /** Transfer ids one of whose notifications (release, remote_blocks) a fault dropped. */
  private readonly lostNotifications = new Set<string>();
  /** Request ids (p-i / d-i) one of whose READ/WRITE failed. */
  private readonly cutTransfers = new Map<string, number>();
  /** Transfer ids whose release was sent and not delivered (yet). */
  private readonly releasesInFlight = new Set<string>();
  /** READ transfer id → READs posted and not ended yet, and when the last of them ended. */
  private readonly reads = new Map<
    string,
    { to: string; open: Set<number>; endedAtMs: number | null; judged: boolean; allocations: Map<number, number> }
  >();
  private readonly promptRelease = new Map<
    number,
    { pages: number[]; allocations: number[]; byMs: number; point: CancelPoint; judged: boolean }
  >();

  constructor(
    private readonly w: SimWorld,
    private readonly cancels: CancelPoints,
  ) {
    w.fabric.onEvent((ev) => this.fabricEvent(ev));
  }

  private fabricEvent(ev: FabricEvent): void {
    // A release sent and never delivered (dropped, or its sender went away meanwhile) counts as lost.
    if (ev.t === 'notify-send' && ev.notification.type === 'release')
      this.releasesInFlight.add(ev.notification.transferId);
    if (ev.t === 'notify-deliver' && ev.delivered) this.releasesInFlight.delete(ev.notification.transferId);
    if (ev.t === 'notify-deliver' && !ev.delivered) this.lostNotifications.add(ev.notification.transferId);
    if (ev.t === 'post' && ev.item.kind === 'read' && ev.item.transferId !== null) {
      const r = this.reads.get(ev.item.transferId) ?? {
        to: ev.item.to,
        open: new Set<number>(),
        endedAtMs: null,
        judged: false,
        allocations: new Map<number, number>(),
      };
      r.open.add(ev.item.id);
      r.endedAtMs = null;
      this.reads.set(ev.item.transferId, r);
    }
    if ((ev.t === 'land' || ev.t === 'fail') && ev.item.kind === 'read' && typeof ev.item.transferId === 'string')
      this.readEnded(ev);
    if (ev.t === 'fail' && (ev.item.kind === 'read' || ev.item.kind === 'write'))
      for (const id of ev.item.label.requestIds ?? []) this.cutTransfers.set(id, ev.item.id);
  }

  /** A READ landed or failed: once the last READ of its transfer ended, prefill's pages are due back soon. */
  private readEnded(ev: Extract<FabricEvent, { t: 'land' | 'fail' }>): void {
    const r = this.reads.get(ev.item.transferId ?? '');
    if (r === undefined || !r.open.delete(ev.item.id) || r.open.size > 0) return;
    r.endedAtMs = this.w.env.nowMs();
    // The generation of each page prefill lent (it must end soon: freed, or freed and reused).
    const a = this.w.proxy.requests.find((x) => x.transferId === ev.item.transferId)?.prefillAnswer ?? null;
    if (this.w.P.alive)
      for (const b of this.pagesOf(a?.params ?? null)) r.allocations.set(b, this.w.P.lifecycle.allocation(b) ?? -1);
  }

  private pagesOf(params: Record<string, unknown> | null): number[] {
    const ids = params?.['remote_block_ids'];
    return Array.isArray(ids) ? (ids.flat() as number[]) : [];
  }

  /** After every step: new answers lend pages; a page past its deadline is stranded. */
  afterStep(): void {
    const w = this.w;
    const lc = w.P.lifecycle;
    if (!w.P.alive) return;
    const now = w.env.nowMs();
    for (const r of w.proxy.requests) {
      const a = r.prefillAnswer;
      if (a === null || this.answered.has(r.spec.index)) continue;
      this.answered.add(r.spec.index);
      for (const b of this.pagesOf(a.params)) {
        const allocation = lc.allocation(b);
        if (allocation !== null)
          this.held.set(b, { index: r.spec.index, allocation, deadlineMs: a.atMs + LEASE_HOLD_MS });
      }
    }
    for (const [b, h] of this.held) {
      if (lc.allocation(b) !== h.allocation) this.held.delete(b);
      else if (now > h.deadlineMs) {
        this.held.delete(b);
        w.violate(
          'lease',
          `P block ${b}, held for request ${h.index}, still not back in the pool ${Math.round(now - h.deadlineMs + LEASE_HOLD_MS)} ms after prefill answered (lease ${SIM_LEASE_MS} ms + an in-flight transfer's timeout ${SIM_TRANSFER_TIMEOUT_MS} ms + ${LEASE_SLACK_MS} ms slack) [history: ${lc.history(b)}]`,
        );
      }
    }
    this.checkPromptRelease(now);
    this.checkReleaseAfterRead(now);
  }

  /**
   * Every READ that ended (landed or failed) releases prefill's pages: they are back in the pool within
   * CANCEL_RELEASE_MS of its end, not left to the lease (unless a fault dropped a notification of the
   * transfer, or the lease came first).
   */
  private checkReleaseAfterRead(now: number): void {
    const w = this.w;
    for (const [transferId, r] of this.reads) {
      if (r.judged || r.endedAtMs === null || now <= r.endedAtMs + CANCEL_RELEASE_MS) continue;
      r.judged = true;
      const q = w.proxy.requests.find((x) => x.transferId === transferId);
      const a = q?.prefillAnswer ?? null;
      if (q === undefined || a === null || !w.P.alive || this.lostNotifications.has(transferId)) continue;
      if (this.releasesInFlight.has(transferId)) continue; // sent, never delivered: the lease frees them
      if (w.instanceOf(r.to) !== w.P) continue; // judged on the one prefill the lease oracle follows
      if (a.atMs + SIM_LEASE_MS <= r.endedAtMs + CANCEL_RELEASE_MS) continue;
      // A page another request shares (a prefix hit on prefill) stays while that request runs, its own
      // READ has not ended long enough ago, or its release was lost (its lease frees it).
      const settled = (x: (typeof w.proxy.requests)[number]): boolean => {
        const e = this.reads.get(x.transferId)?.endedAtMs ?? null;
        const lost = this.lostNotifications.has(x.transferId) || this.releasesInFlight.has(x.transferId);
        return e !== null && now > e + CANCEL_RELEASE_MS && !lost;
      };
      const shared = new Set(
        w.proxy.requests
          .filter((x) => x !== q)
          .flatMap((x) => [
            ...w.P.engine.kv.getBlockIds(w.proxy.prefillId(x)).flat(),
            ...(x.prefillAnswer !== null && !settled(x) ? this.pagesOf(x.prefillAnswer.params) : []),
          ]),
      );
      const still = this.pagesOf(a.params).filter(
        (b) => !shared.has(b) && w.P.lifecycle.allocation(b) === (r.allocations.get(b) ?? -1),
      );
      if (still.length > 0)
        w.violate(
          'lease',
          `request ${q.spec.index}: its READ ended at ${Math.round(r.endedAtMs)} ms, yet P blocks ${still.join(',')} are still held ${CANCEL_RELEASE_MS} ms later (the release never freed them; only the lease will)`,
        );
    }
  }

  /** Cancelled (at any point) after prefill answered: its pages must come back soon, by decode's release or push. */
  private checkPromptRelease(now: number): void {
    const w = this.w;
    for (const c of this.cancels.applied) {
      const answer = w.proxy.requests[c.index]?.prefillAnswer ?? null;
      if (this.promptRelease.has(c.index) || answer === null || answer.atMs > c.atMs) continue;
      const pages = this.pagesOf(answer.params);
      const allocations = pages.map((b) => w.P.lifecycle.allocation(b) ?? -1);
      const byMs = c.atMs + CANCEL_RELEASE_MS;
      this.promptRelease.set(c.index, { pages, allocations, byMs, point: c.point, judged: false });
    }
    for (const [index, p] of this.promptRelease) {
      if (p.judged) continue;
      const still = p.pages.filter((b, k) => w.P.lifecycle.allocation(b) === p.allocations[k]);
      p.judged = still.length === 0 || now > p.byMs; // each cancel is judged once
      if (still.length === 0 || now <= p.byMs) continue;
      const a = w.proxy.requests[index]?.prefillAnswer;
      const leaseFirst = a !== undefined && a !== null && a.atMs + SIM_LEASE_MS <= p.byMs;
      if (leaseFirst || this.lostNotifications.has(w.proxy.requests[index]?.transferId ?? '')) continue;
      w.violate(
        'cancel',
        `request ${index}: its client went away (${p.point}) after prefill answered, yet P blocks ${still.join(',')} are still held ${CANCEL_RELEASE_MS} ms later (decode never released them; only the lease will)`,
      );
    }
  }

  /** At the end: no success over a cancel with partial output, none over a cut transfer. */
  judgeEnd(): void {
    const w = this.w;
    for (const r of w.proxy.requests) {
      const o = r.outcome;
      if (o === null || !o.ok) continue;
      const i = r.spec.index;
      const cancel = this.cancels.applied.find((c) => c.index === i);
      if (cancel !== undefined && o.tokenIds.length !== r.spec.sampling.maxTokens)
        w.violate(
          'cancel',
          `request ${i}: cancelled (${cancel.point}) at ${cancel.atMs} ms, yet reported success (${o.finishReason}) with ${o.tokenIds.length} of ${r.spec.sampling.maxTokens} tokens`,
        );
      // Under 'recompute' a cut transfer may end in success: the colocated comparison judges its output.
      if (w.scenario.decode.scheduler.kvLoadFailurePolicy !== 'fail') continue;
      const cut = this.cutTransfers.get(w.proxy.decodeId(r)) ?? this.cutTransfers.get(w.proxy.prefillId(r));
      if (cut !== undefined)
        w.violate(
          'cancel',
          `request ${i}: its transfer net#${cut} failed, yet it reported success (${o.finishReason}, ${o.numExternalTokens} tokens from prefill)`,
        );
    }
  }
}
