/**
 * WRITE consumer (decode, WRITE mode): one transfer per request waiting for the producer to push.
 *
 *   granted ──write_done──> done (finishedRecving)
 *      │  └──deadline or write_refused──> expiring ──drained──> expired (load failed: recompute or fail by policy)
 *      │                      └──request aborted──┐
 *      └──request aborted──> aborted ──drained or write_done──> aborted-released (finishedSending)
 *
 * `granted`: decode's pages are granted to the producer and it was told where to write (sent without
 * blocking the step). The grant is revoked on every way out, before the pages can be reused; a load that
 * did not finish (deadline, abort) then waits for drainGrant: a WRITE under way when the grant ended
 * lands no byte after it settles (the tcp receiver drops the rest of its payload and refuses it), so the
 * pages can be recomputed or freed without a late byte of the producer over them.
 *
 * The scheduler exempts the load's pages from zeroing (an async load), so a page the WRITE fills only in
 * part (larger than prefill's pages, issue 14) has its clipped tail zeroed here once the load is done: the
 * second zeroing site of vLLM PR 49612.
 */
import { isHandoffError } from '../util/errors.ts';
import { sameToken } from '../transfer/core/grant_table.ts';
import type { KVConnectorOutput } from '../worker/scheduler_output.ts';
import type { NotifyReqMeta } from '../worker/connector_metadata.ts';
import type { PageSpan } from '../device/types.ts';
import { TransferTable } from './transfer_table.ts';
import type { WorkerContext } from './worker_context.ts';

type RecvState = 'granted' | 'aborted' | 'done' | 'expiring' | 'expired' | 'aborted-released';
interface RecvTransfer {
  state: RecvState;
  requestId: string;
  deadlineMs: number;
  blockIds: number[];
  /** Bytes of the destination pages past the written tokens: zeroed once the WRITE is done. */
  tails: PageSpan[];
  /** The grant's token (null until granted): proves a write_done once the grant itself is gone. */
  grant: string | null;
  /** The producer's engine (null until it was found): once it is gone here, no push or write_done can come. */
  producer: string | null;
  /** Set when the producer refused to push (its save is gone): why the load failed. */
  refused?: string;
}

const RECV_TRANSITIONS = {
  granted: ['done', 'expiring', 'aborted'],
  aborted: ['aborted-released'],
  done: [],
  expiring: ['expired', 'aborted'],
  expired: [],
  'aborted-released': [],
} as const;

type LoadFailures = Pick<KVConnectorOutput, 'failedLoadReqIds' | 'invalidBlockIds' | 'loadErrors'>;

export class WriteConsumer {
  private readonly recvs = new TransferTable<RecvState, RecvTransfer>('WRITE consumer', RECV_TRANSITIONS, 1 << 16);
  /** Outbox: aborted requests whose load had already ended (their pages may be freed). */
  private releaseNow: string[] = [];
  stats = { tailsZeroed: 0 };

  constructor(
    private readonly ctx: WorkerContext,
    /** Wakes the engine: a drain that settled has a load or a release to report. */
    private readonly onActivity: () => void = () => {},
  ) {}

  get size(): number {
    return this.recvs.size;
  }

  /** Grant the producer this request's pages and tell it where to write, without blocking the step. */
  notifyRemoteBlocks(n: NotifyReqMeta): void {
    const {
      requestId,
      transferId,
      localBlockIds: local,
      remoteEngineId,
      remoteHost: host,
      remotePort: port,
      skipBlocks,
      endToken,
    } = n;
    // Only the pages after decode's prefix hit are granted (attention groups; Mamba groups have no hit).
    const writable = local.map((ids, g) => (g < this.ctx.numAttnGroups ? ids.slice(skipBlocks) : ids));
    const now = this.ctx.env.nowMs();
    const t = this.recvs.add(transferId, {
      state: 'granted',
      requestId,
      deadlineMs: now + this.ctx.config.transferTimeoutMs,
      blockIds: writable.flat(),
      tails: this.tailsOf(local, skipBlocks, endToken),
      grant: null,
      producer: null,
    });
    let engineId: string;
    try {
      engineId = this.ctx.peers.readyEngine(host, port, remoteEngineId);
    } catch (e) {
      if (!isHandoffError(e)) throw e;
      t.deadlineMs = now; // nothing can be written: fail the load at the next postForward
      this.ctx.log?.warn({ requestId, transferId, err: e.message }, 'could not tell the producer where to write');
      return;
    }
    t.producer = engineId;
    const grant = this.ctx.transfer.issueGrant({
      transferId,
      peerEngineId: engineId,
      blockIds: writable.flat(),
      // The grant outlives the wait for the push (revoked at the deadline): with lease_ms (the producer's
      // hold) below transfer_timeout_ms, a push inside the timeout was refused and the load waited it out.
      ttlMs: Math.max(this.ctx.config.leaseMs, this.ctx.config.transferTimeoutMs),
    });
    t.grant = grant.token;
    const payload = { blockIds: local, skipBlocks, endToken, grant: grant.token };
    this.ctx.transfer.notify(engineId, { type: 'remote_blocks', transferId, payload }).catch((e: unknown) => {
      if (!isHandoffError(e)) throw e;
      // The side channel may be gone or stuck (dropped after a silence): the next use handshakes again.
      // Kept as ready, every later notice to this producer would fail and its load wait for the deadline.
      this.ctx.peers.forget(host, port);
      this.ctx.log?.warn(
        { requestId, transferId, err: e.message },
        'could not tell the producer where to write; the load fails now',
      );
      // The producer may never learn where to write: fail the load at the next collect (its grant is revoked
      // and drained first, so a notice that did get through pushes nothing over the recompute).
      if (this.recvs.get(transferId) === t && t.state === 'granted') t.deadlineMs = this.ctx.env.nowMs();
      this.onActivity();
    });
  }

  /**
   * The request finished (aborted) while the producer may still write: no WRITE lands in its pages once
   * the grant's drain settled, and they are released then (or at a write_done carrying the grant's token, if
   * that comes first). A
   * request whose producer was never told where to write (or whose load already ended) is released at
   * the next collect.
   */
  aborted(transferId: string, requestId: string): void {
    const t = this.recvs.get(transferId);
    if (!this.ctx.mutations.fenceAbortedWrites && t?.state === 'granted') {
      // Mutant stale-writer: no fence, the pages go back at once while the producer may still WRITE them.
      this.recvs.move(transferId, 'aborted');
      this.recvs.move(transferId, 'aborted-released');
      return;
    }
    this.ctx.transfer.revokeGrant(transferId);
    if (t?.state === 'granted') {
      this.recvs.move(transferId, 'aborted');
      this.afterDrain(transferId);
    }
    // Timed out and draining: that drain now releases it instead of failing the load.
    else if (t?.state === 'expiring') this.recvs.move(transferId, 'aborted');
    // Never told where to write, or its load already ended: nothing can land.
    else if (t === undefined || t.state === 'done' || t.state === 'expired') this.releaseNow.push(requestId);
  }

  /**
   * Once nothing more lands for `transferId` (its grant revoked): an expiring load is reported failed, an
   * aborted one released (unless write_done came first).
   */
  private afterDrain(transferId: string): void {
    void this.ctx.transfer.drainGrant(transferId).then(() => {
      const state = this.recvs.get(transferId)?.state;
      if (state === 'expiring') this.recvs.move(transferId, 'expired');
      else if (state === 'aborted') this.recvs.move(transferId, 'aborted-released');
      this.onActivity();
    });
  }

  /**
   * The producer will never push (it gave the save up: its lease ended while the request waited here, or
   * the push failed): the load fails now, once its grant's drain settled, rather than at the deadline.
   */
  writeRefused(transferId: string): void {
    const t = this.recvs.get(transferId);
    if (t?.state !== 'granted') return;
    this.ctx.transfer.revokeGrant(transferId);
    t.refused =
      "the producer will not push the request's KV (its lease ended before it was told where, or the push failed)";
    this.recvs.move(transferId, 'expiring');
    this.afterDrain(transferId);
  }

  /**
   * The producer's data is visible in our pages. Only the grant's token proves it: the transfer layer
   * checks a notice against a live grant, and passes on anyone's when none lives (an aborted load's grant is
   * revoked; a granted load's may have expired, or was never issued when the producer could not be found).
   * A peer that learned the transfer id must neither hand pages back to the pool while the producer's WRITE
   * may still be landing in them, nor have decode run a request on pages nobody wrote.
   */
  writeDone(transferId: string, token: unknown): void {
    const t = this.recvs.get(transferId);
    if (t === undefined || (t.state !== 'granted' && t.state !== 'aborted')) return;
    if (t.grant === null || !sameToken(t.grant, token)) return;
    this.ctx.transfer.revokeGrant(transferId);
    this.recvs.move(transferId, t.state === 'aborted' ? 'aborted-released' : 'done');
  }

  /**
   * The clipped tails of a WRITE of tokens [skipBlocks pages, endToken) into `local` (per group, from
   * token 0): the slots of the last written page past endToken (decode's page larger than prefill's).
   */
  private tailsOf(local: number[][], skipBlocks: number, endToken: number): PageSpan[] {
    const plan = { local: [] as number[][], runs: [] as Array<[number, number]> };
    local.forEach((ids, g) => {
      const bs = this.ctx.blockSizeOf(g);
      const start = Math.min(skipBlocks * bs, endToken);
      plan.runs.push([start, endToken]);
      plan.local.push(ids.slice(Math.floor(start / bs), start >= endToken ? 0 : Math.ceil(endToken / bs)));
    });
    return this.ctx.clippedTails(plan);
  }

  /**
   * What finished, then loads past their deadline (vLLM's get_block_ids_with_load_errors: reported once
   * their drain settled, at a later collect), and aborted loads that may be released. A finished
   * load's clipped tails are zeroed now, on the compute stream: after write_done told us the data is
   * visible (the WRITE landed), before any forward of the request (it runs only once we report it).
   * `tailsZeroed` settles when that zeroing has run: the caller waits for it before reporting (see
   * OneSidedWorker.postForward), so no page it zeroes is freed and handed to another WRITE first.
   */
  collect(step?: number): {
    finishedRecving: string[];
    releasedAborted: string[];
    loads: LoadFailures;
    tailsZeroed: Promise<unknown> | null;
  } {
    const loads: LoadFailures = { failedLoadReqIds: [], invalidBlockIds: [], loadErrors: {} };
    const now = this.ctx.env.nowMs();
    const finished = this.recvs.take('done');
    const tails = finished.flatMap(([, t]) => t.tails);
    let tailsZeroed: Promise<unknown> | null = null;
    if (tails.length > 0 && this.ctx.mutations.zeroClippedTails) {
      this.stats.tailsZeroed += new Set(tails.map((s) => s.block)).size;
      tailsZeroed = this.ctx.device.compute.enqueue({
        op: { kind: 'zero-spans', spans: tails },
        label: {
          what: 'zero-tail',
          requestIds: finished.map(([, t]) => t.requestId),
          ...(step !== undefined ? { step } : {}),
        },
      }).done;
    }
    const done = finished.map(([, t]) => t.requestId);
    const releasedAborted = [...this.releaseNow, ...this.recvs.take('aborted-released').map(([, t]) => t.requestId)];
    this.releaseNow = [];
    for (const [transferId, t] of [...this.recvs.entries()]) {
      // An aborted load is released once its drain settles, whatever the deadline.
      if (t.state !== 'granted') continue;
      // The producer's side channel closed (it died or restarted): its data connections went with it (a
      // push under way failed) and no write_done can reach us. Waiting out the deadline only delayed the
      // recompute (30 s by default).
      const gone = t.producer !== null && this.ctx.transfer.peerMetadata(t.producer) === null;
      if (t.deadlineMs > now && !gone) continue;
      if (t.deadlineMs > now) t.refused = `the producer ${t.producer} is gone (its side channel closed)`;
      this.ctx.transfer.revokeGrant(transferId); // stop accepting the producer's WRITEs into these pages first
      this.recvs.move(transferId, 'expiring');
      this.afterDrain(transferId);
    }
    for (const [, t] of this.recvs.take('expired')) {
      loads.failedLoadReqIds.push(t.requestId);
      loads.invalidBlockIds.push(...t.blockIds);
      loads.loadErrors[t.requestId] =
        t.refused === undefined
          ? { code: 'TIMEOUT', message: `the producer did not write within ${this.ctx.config.transferTimeoutMs} ms` }
          : { code: 'KV_LOAD_FAILED', message: t.refused };
    }
    return { finishedRecving: done, releasedAborted, loads, tailsZeroed };
  }
}
