/**
 * READ consumer (decode, READ mode): one transfer per request that loads this step.
 *
 *   posted ──landed──> landed ─┐
 *      │                       ├─ release sent, removed
 *      └──failed/timeout──> failed ─┘          (an empty READ or one refused at post starts as landed/failed)
 *
 * Every READ of a step is posted from the host (the NIC writes the pages without waiting for the compute
 * stream) and awaited with one deadline for the step before the forward is enqueued; a failed or
 * timed-out READ is aborted first (the NIC will not touch the pages again). Every READ, failed or not,
 * releases the producer's pages. Keyed by request id: two requests may name the same transfer.
 *
 * Clipped tails (decode pages larger than the prefill pages they receive, issue 14): the slots past the
 * transferred tokens were excluded from zeroing with their page (a whole-page zero would race the READ),
 * so once the READ landed they are zeroed by a zero-spans op on the compute stream, enqueued by the host
 * after it observed the landing and before the step's forward (vLLM PR 49612's second zeroing site).
 */
import { HandoffError, isHandoffError } from '../util/errors.ts';
import type { PageSpan } from '../device/types.ts';
import { rethrowIfAssertion } from '../util/assert.ts';
import type { TransferHandle } from '../transfer/core/types.ts';
import type { LoadResult } from '../worker/hooks.ts';
import type { RecvReqMeta } from '../worker/connector_metadata.ts';
import { TransferTable } from './transfer_table.ts';
import { checkPeerPages, type WorkerContext } from './worker_context.ts';

type ReadState = 'posted' | 'landed' | 'failed' | 'late';
interface ReadTransfer {
  state: ReadState;
  r: RecvReqMeta;
  /** Its work requests (several when its ranges exceed what one carries); empty when nothing was posted. */
  handles: TransferHandle[];
  error: HandoffError | null;
  /** Bytes of the destination pages past the transferred tokens, zeroed once the READ landed. */
  tails: PageSpan[];
  /** An async READ (asyncRead): settled in the background, reported by collectAsync, not awaited by the step. */
  async: boolean;
  /** Its request finished (aborted) while it loaded: reported freeable once settled, never as loaded. */
  aborted: boolean;
  postedAtMs: number;
}

const READ_TRANSITIONS = { posted: ['landed', 'failed', 'late'], late: ['landed'], landed: [], failed: [] } as const;
export const READS_MAX = 4096;
/**
 * grant_expires_ms is prefill's wall clock, rounded, and its lease ends on its monotonic clock: a grant
 * refused this close to that time (or after it) is taken as ended by the lease. The same slack applies to
 * grantLapsesAtMs (decode's clock; the grant was issued a little before the request arrived here).
 */
const GRANT_EXPIRY_SLACK_MS = 1000;

export class ReadConsumer {
  private readonly reads = new TransferTable<ReadState, ReadTransfer>('READ consumer', READ_TRANSITIONS, READS_MAX);
  /** Aborted requests whose async READ was reported already: freeable at the next collect. */
  private releaseNow: string[] = [];
  /** The engine is closing: no READ is waited for past its abort (see abandon). */
  private closing = false;
  /** Latency of each request's READs (post → landed, ms), drained by the metrics; bounded. */
  private latenciesMs: number[] = [];
  stats = {
    readsPosted: 0,
    /** Of them, async READs (asyncRead). */
    readsAsync: 0,
    readsFailed: 0,
    releasesSent: 0,
    releasesFailed: 0,
    hostSyncWaits: 0,
    tailsZeroed: 0,
  };

  constructor(
    private readonly ctx: WorkerContext,
    /** An async READ settled: the engine loop wakes to report it. */
    private readonly onActivity: () => void = () => {},
  ) {}

  get numInFlight(): number {
    return this.reads.size;
  }

  /**
   * Async READs (or aborted requests' pages) not reported yet: the engine keeps stepping for them. Asked on
   * every engine loop turn: it stops at the first async entry (the table holds little else between steps).
   */
  get hasAsync(): boolean {
    if (this.releaseNow.length > 0) return true;
    for (const [, t] of this.reads.entries()) if (t.async) return true;
    return false;
  }

  /** Post this step's READs from the host (vLLM's start_load_kv). */
  async startLoadKv(reqs: RecvReqMeta[], step: number): Promise<void> {
    if (reqs.length === 0) return;
    if (this.ctx.config.syncBeforeRead && reqs.some((r) => r.localBlockIds.some((g) => g.length > 0))) {
      // The alternative fix: the host waits until the stream has run everything queued so far (the
      // previous forward and this step's zeroing) before any READ is posted.
      this.stats.hostSyncWaits++;
      await this.ctx.device.compute.recordEvent().wait();
    }
    for (const r of reqs) {
      const t = this.post(r, step);
      // Nothing to READ (an unused load's release, a full local hit): released now, without an entry, so
      // that any number of them in one step (a flood of refused or cancelled requests) fits the table.
      if (t.state === 'landed' && t.handles.length === 0 && !t.async) {
        this.release(r);
        continue;
      }
      this.reads.add(r.requestId, t);
      if (!t.async) continue;
      this.stats.readsAsync++;
      this.settleInBackground(r.requestId, t);
    }
  }

  /** An async READ: settled with its own deadline while steps go on; collectAsync reports it. */
  private settleInBackground(id: string, t: ReadTransfer): void {
    const deadlineMs = this.ctx.env.nowMs() + (this.closing ? 0 : this.ctx.config.transferTimeoutMs);
    const settled = t.state === 'posted' ? this.settle(id, t, deadlineMs) : Promise.resolve();
    // A rejection here is an assertion (settle takes every HandoffError): it crashes, as it must.
    void settled.then(() => this.onActivity());
  }

  private post(r: RecvReqMeta, step: number): ReadTransfer {
    const postedAtMs = this.ctx.env.nowMs();
    const base = { r, error: null, async: r.async === true, aborted: false, postedAtMs };
    if (r.localBlockIds.every((g) => g.length === 0)) return { ...base, state: 'landed', handles: [], tails: [] };
    try {
      const peerEngineId = this.ctx.peers.readyEngine(r.remoteHost, r.remotePort, r.remoteEngineId);
      const peer = this.ctx.peerGeometry(peerEngineId);
      if (peer.blockSizes[0] !== r.remoteBlockSize)
        throw new HandoffError(
          'BAD_TRANSFER_PARAMS',
          `remote_block_ids are in pages of ${r.remoteBlockSize} tokens; ${peerEngineId} has pages of ${peer.blockSizes[0]}`,
        );
      // The client's ids, before they become byte offsets (past 2^53 no safe integer: the transfer
      // engine asserts on those, which crashed the engine loop).
      checkPeerPages(r.remoteBlockIds, peer, peerEngineId, 'kv_transfer_params.remote_block_ids');
      const plan = { local: r.localBlockIds, remote: r.remoteBlockIds, runs: r.tokenRuns };
      this.stats.readsPosted++;
      const handles = this.ctx.workRequestsFor(plan, peer, true).map(({ ranges, footprint }) =>
        this.ctx.transfer.postRead({
          peerEngineId,
          transferId: r.transferId,
          grantToken: r.grant,
          ranges,
          label: { what: 'kv-read', requestIds: [r.requestId], step },
          footprint,
        }),
      );
      // Mutant read-done-early: the local ack of the post taken for the data having landed.
      const state = this.ctx.mutations.readDoneWhenLanded ? 'posted' : 'landed';
      return { ...base, state, handles, tails: this.ctx.clippedTails(plan) };
    } catch (e) {
      if (!isHandoffError(e)) throw e;
      return { ...base, state: 'failed', handles: [], error: e, tails: [] };
    }
  }

  /**
   * Await every READ posted this step (vLLM #60808: unconditional), with one deadline for the step;
   * report the failed ones and release every one.
   */
  async awaitReadsIssuedThisStep(step: number): Promise<LoadResult> {
    const result: LoadResult = { failedReqIds: [], invalidBlockIds: [], loadErrors: {} };
    const deadlineMs = this.ctx.env.nowMs() + (this.closing ? 0 : this.ctx.config.transferTimeoutMs);
    // In posting order: each READ is settled, reported if it failed, and released before the next.
    const tails: PageSpan[] = [];
    for (const [id, t] of [...this.reads.entries()]) {
      if (t.state === 'late' || t.async) continue;
      if (t.state === 'posted') await this.settle(id, t, deadlineMs);
      if (t.state === 'failed') this.report(t, result);
      else tails.push(...t.tails);
      this.reads.delete(id);
      this.release(t.r);
    }
    this.zeroTails(tails, step);
    return result;
  }

  /**
   * vLLM's get_finished for async READs: those that landed (their tails' zeroing enqueued; `tailsZeroed`
   * settles once it ran), those that failed (reported like a step's failed READ), and those whose request
   * was aborted (its pages may be freed: the NIC no longer writes them). Each is released to its producer.
   */
  collectAsync(step: number): {
    finishedRecving: string[];
    releasedAborted: string[];
    loads: LoadResult;
    tailsZeroed: Promise<void> | null;
  } {
    const loads: LoadResult = { failedReqIds: [], invalidBlockIds: [], loadErrors: {} };
    const finishedRecving: string[] = [];
    const releasedAborted = this.releaseNow;
    this.releaseNow = [];
    const tails: PageSpan[] = [];
    for (const [id, t] of [...this.reads.entries()]) {
      if (!t.async || (t.state !== 'landed' && t.state !== 'failed')) continue;
      this.reads.delete(id);
      if (t.aborted) releasedAborted.push(id);
      else if (t.state === 'failed') this.report(t, loads);
      else {
        finishedRecving.push(id);
        tails.push(...t.tails);
      }
      // After report, as for a step's READs: a READ failed for a side channel that is gone makes the
      // release handshake again (sent first, it went down the dead channel and left the pages to the lease).
      this.release(t.r);
    }
    // With async scheduling the zeroing sits behind the next step's forward: the load is reported once it
    // ran, so its pages cannot be freed and reused (another READ landing) before it (as WRITE loads).
    const tailsZeroed = this.zeroTails(tails, step) ? this.ctx.device.compute.recordEvent().wait() : null;
    return { finishedRecving, releasedAborted, loads, tailsZeroed };
  }

  /**
   * An async READ's request finished (aborted) while it loads: the NIC is told to stop; its pages are
   * reported freeable once it acknowledged (collectAsync). Only requests the scheduler held as async-loading
   * are named here.
   */
  aborted(requestId: string): void {
    const t = this.reads.get(requestId);
    // Already reported (its load finished in a step whose output the scheduler had not applied when the
    // request ended): the NIC is done with its pages, which may be freed at the next collect.
    if (t === undefined) return void this.releaseNow.push(requestId);
    if (!t.async || t.aborted) return;
    t.aborted = true;
    // catch-ok: abort() rejects only when the engine closes, which fails the READ anyway (settle sees it)
    if (t.state === 'posted') void this.ctx.transfer.abort(t.handles).catch(() => undefined);
  }

  /**
   * Zero the clipped tails of READs the host has seen land, on the compute stream: after the landing
   * (the host observed it: no race with the READ's bytes), before the forward enqueued next (FIFO).
   */
  private zeroTails(spans: PageSpan[], step: number): boolean {
    if (spans.length === 0 || !this.ctx.mutations.zeroClippedTails) return false;
    this.stats.tailsZeroed += new Set(spans.map((s) => s.block)).size;
    this.ctx.device.compute.enqueue({ op: { kind: 'zero-spans', spans }, label: { what: 'zero-tail', step } });
    return true;
  }

  private async settle(id: string, t: ReadTransfer, deadlineMs: number): Promise<void> {
    try {
      // Mutant split-first-wr-only: the READ counted done once its first work request landed.
      const handles = this.ctx.mutations.awaitEveryWorkRequest ? t.handles : t.handles.slice(0, 1);
      await this.ctx.transfer.wait(handles, Math.max(0, deadlineMs - this.ctx.env.nowMs()));
      if (this.latenciesMs.length < 4096) this.latenciesMs.push(this.ctx.env.nowMs() - t.postedAtMs);
      this.reads.move(id, 'landed');
    } catch (e) {
      if (!isHandoffError(e)) throw e;
      // The NIC must not touch the pages any more (the bug zoo's abort-not-awaited reports without waiting).
      const stopped = this.ctx.transfer.abort(t.handles);
      // catch-ok: the mutant's abort is left to run; abort() rejects only when the engine closes
      if (!this.ctx.mutations.awaitAbortOfFailedRead) void stopped.catch(() => undefined);
      else await stopped;
      t.error = e;
      this.reads.move(id, 'failed');
    }
  }

  private report(t: ReadTransfer, result: LoadResult): void {
    const error = this.lapsedGrant(t.r, t.error as HandoffError);
    this.stats.readsFailed++;
    // The side channel to that peer is gone: handshake again (for the release and the next READ).
    if (error.code === 'PEER_UNAVAILABLE')
      this.ctx.peers.forgetChannelOf(t.r.remoteHost, t.r.remotePort, t.r.remoteEngineId);
    this.ctx.log?.warn({ requestId: t.r.requestId, code: error.code, err: error.message }, 'KV READ failed');
    result.failedReqIds.push(t.r.requestId);
    result.invalidBlockIds.push(...t.r.localBlockIds.flat());
    result.loadErrors[t.r.requestId] = { code: error.code, message: error.message };
  }

  /**
   * A grant refused after the time prefill gave for its end (grant_expires_ms) died of the lease: the
   * request waited here (decode busy, pool full) longer than prefill holds pages. That is no fault of the
   * client's params: a transient load failure, left to kvLoadFailurePolicy, not a 403. A grant refused
   * before that time (forged, never issued, pages not granted) stays GRANT_DENIED.
   *
   * grant_expires_ms is prefill's wall clock: with this host's clock seconds behind, a lease that ended
   * while the request waited here looked live (a 403 for good params). So the end is also judged on this
   * engine's monotonic clock, from the request's arrival and grant_ttl_ms (grantLapsesAtMs).
   */
  private lapsedGrant(r: RecvReqMeta, error: HandoffError): HandoffError {
    if (error.code !== 'GRANT_DENIED') return error;
    const expiresMs = r.grantExpiresMs ?? null;
    const lapsesAtMs = r.grantLapsesAtMs ?? null;
    const byWall = expiresMs !== null && this.ctx.env.wallMs() >= expiresMs - GRANT_EXPIRY_SLACK_MS;
    const byWait = lapsesAtMs !== null && this.ctx.env.nowMs() >= lapsesAtMs - GRANT_EXPIRY_SLACK_MS;
    if (!byWall && !byWait) return error;
    const waited = byWall
      ? `prefill's lease ended (grant_expires_ms ${expiresMs}) before this READ`
      : `prefill's lease ended (the request waited here past grant_ttl_ms) before this READ`;
    return new HandoffError('KV_LOAD_FAILED', `${waited}: ${error.message}`);
  }

  /** Mutant `no-await-reads` only: the step's READs are left in flight while its forward is enqueued. */
  leaveReadsInFlight(step: number): LoadResult {
    for (const [id, t] of this.reads.inState('posted')) if (!t.async) this.reads.move(id, 'late');
    const landed = this.takeSync('landed');
    this.zeroTails(
      landed.flatMap(([, t]) => t.tails),
      step,
    );
    for (const [, t] of [...landed, ...this.takeSync('failed')]) this.release(t.r);
    return { failedReqIds: [], invalidBlockIds: [], loadErrors: {} };
  }

  /** The step's (not async) READs in `state`, taken out of the table. */
  private takeSync(state: 'landed' | 'failed'): Array<[string, ReadTransfer]> {
    const out = this.reads.inState(state).filter(([, t]) => !t.async);
    for (const [id] of out) this.reads.delete(id);
    return out;
  }

  /**
   * After the forward: READs left in flight by the mutant are awaited and released. Only those: with
   * async scheduling this runs while the next step awaits its own READs, whose landed ones (an empty
   * READ lands at post) it took, released and removed under that step (the engine loop then crashed on
   * the missing transfer: late_reads.test.ts).
   */
  async settleLateReads(step: number): Promise<void> {
    const late = this.reads.inState('late');
    for (const [id, t] of late) {
      await this.ctx.transfer
        .wait(t.handles, this.ctx.config.transferTimeoutMs)
        .catch((e: unknown) => rethrowIfAssertion(e));
      this.reads.move(id, 'landed');
    }
    for (const [id] of late) this.reads.delete(id);
    this.zeroTails(
      late.flatMap(([, t]) => t.tails),
      step,
    );
    for (const [, t] of late) this.release(t.r);
  }

  /**
   * The engine is closing: the step awaiting READs (a hung producer) would hold the engine loop, and the
   * process's shutdown, until its deadline. Abort the READs in flight (the step then settles them as failed
   * once the NIC acknowledged) and give those of a later step no deadline.
   */
  abandon(): void {
    this.closing = true;
    const posted = this.reads.inState('posted').flatMap(([, t]) => t.handles);
    // catch-ok: abort() rejects only when the transfer engine closes, which fails these READs anyway
    if (posted.length > 0) void this.ctx.transfer.abort(posted).catch(() => undefined);
  }

  /** Tell the producer it may free its pages (also after a failure or an empty READ). */
  private release(r: RecvReqMeta): void {
    // Off the step path: a refused request's release may be the first contact with that producer.
    this.ctx.peers
      .resolve(r.remoteHost, r.remotePort, r.remoteEngineId)
      .then((engineId) =>
        this.ctx.transfer.notify(engineId, {
          type: 'release',
          transferId: this.ctx.mutations.releaseNamesTransfer ? r.transferId : r.requestId,
          payload: { grant: r.grant },
        }),
      )
      .then(
        () => void this.stats.releasesSent++,
        (e: unknown) => {
          if (!isHandoffError(e)) throw e;
          this.stats.releasesFailed++;
          // The side channel may be gone or stuck: the next use of this peer handshakes again.
          if (e.code !== 'PEER_NOT_ALLOWED' && e.code !== 'BAD_TRANSFER_PARAMS')
            this.ctx.peers.forget(r.remoteHost, r.remotePort);
          this.ctx.log?.warn(
            { transferId: r.transferId, err: e.message },
            'release notification failed; the producer lease will free the pages',
          );
        },
      );
  }

  drainReadLatencies(): number[] {
    const out = this.latenciesMs;
    this.latenciesMs = [];
    return out;
  }
}
