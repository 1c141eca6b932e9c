/**
 * Scheduler: decides, each step, which requests compute how many tokens, allocates their pages, builds
 * the zeroing list and the connector metadata, and applies the worker's results.
 *
 * schedule():
 *   1. running requests first (decode steps, prefill chunks), preempting the newest when out of pages;
 *   2. waiting requests, page holders first: local prefix hit → connector.getNumNewMatchedTokens →
 *      allocateSlots → updateStateAfterAlloc; async loads park in WAITING_FOR_REMOTE_KVS (skip set);
 *   3. newBlockIdsToZero = takeNewBlockIds() − skip set (null when zeroing is not needed);
 *   4. connector.buildConnectorMeta(output), then connector.excludeReadDestinations: the seed's fix, a
 *      visible step (this step's READ destinations leave the zero list);
 *   5. advance numComputedTokens and output placeholders (async scheduling: one step ahead).
 * updateFromOutput(): append sampled tokens, stop checks, load and forward failures (step_failures.ts),
 * finished sending/receiving, and deferred frees behind the fence (free_fence.ts).
 */
import { assert, defined } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';
import type { Env } from '../util/env.ts';
import type { KVCacheManager, RequestTokens } from '../kv/kv_cache_manager.ts';
import type { ConnectorScheduler } from '../connector/base.ts';
import {
  makeEmptySchedulerOutput,
  type CachedRequestData,
  type ModelRunnerOutput,
  type NewRequestData,
  type SchedulerOutput,
} from '../worker/scheduler_output.ts';
import { FreeFence } from './free_fence.ts';
import { InflightSteps } from './inflight_steps.ts';
import { RequestTransfers } from './request_transfers.ts';
import { holdersFirst, newestIdleHolder } from './waiting_order.ts';
import { mutationsFor, type Mutations } from '../util/mutants.ts';
import { checkRequestFits } from './request_validation.ts';
import { failAsyncLoads, failForward, failRunningLoads, type StepFailureHost } from './step_failures.ts';
import { makeOutput, type EngineOutput } from './output.ts';
import type { SchedulerConfig } from './scheduler_config.ts';
import { finishReasonOf, nextEpoch, Request, stopStatusAfter, type RequestStatus } from './request.ts';
export { DEFAULT_SCHEDULER_CONFIG, type SchedulerConfig } from './scheduler_config.ts';

/** What one schedule() call builds up. */
interface StepBuild { out: SchedulerOutput; budget: number } // prettier-ignore

export class Scheduler {
  readonly requests = new Map<string, Request>();
  private waiting: Request[] = [];
  private running: Request[] = [];
  private step = 0;
  private readonly fence: FreeFence;
  /** Finished or preempted ids not yet told to the worker. */
  private finishedSinceLast: string[] = [];
  private preemptedSinceLast: string[] = [];
  /** Each request's inbound load and outbound page hold (request_transfers.ts). */
  readonly transfers = new RequestTransfers();
  /** Per step: request → epoch when scheduled (outputs of older epochs are dropped), pages it writes. */
  private readonly inflight = new InflightSteps();
  private skipZeroBlockIds = new Set<number>();
  private pendingOutputs: EngineOutput[] = [];
  stats = { preemptions: 0, pagesZeroListed: 0, pagesExcludedFromZeroing: 0, loadFailures: 0 };
  private readonly mutations: Mutations;

  constructor(
    readonly config: SchedulerConfig,
    readonly kv: KVCacheManager,
    readonly connector: ConnectorScheduler,
    private readonly env: Env,
  ) {
    assert(config.maxNumSeqs >= 1 && config.maxNumBatchedTokens >= 1, 'scheduler limits must be positive');
    this.fence = new FreeFence((blocks) => this.kv.freeBlockIds(blocks));
    this.mutations = mutationsFor(config.mutant);
  }

  addRequest(req: Request): void {
    assert(!this.requests.has(req.requestId), `duplicate request id ${req.requestId}`);
    // A finished request's pages may still be held for a peer under its id.
    if (this.transfers.has(req.requestId))
      throw new HandoffError('BAD_REQUEST', `request id ${req.requestId} is still in use`, { param: 'x-request-id' });
    if (this.waiting.length >= this.config.maxWaiting) {
      throw new HandoffError('OVERLOADED', `waiting queue is full (${this.config.maxWaiting} requests)`);
    }
    checkRequestFits(req, this.config, this.kv.config);
    this.requests.set(req.requestId, req);
    this.waiting.push(req);
  }

  /** Abort: the request finishes now; its pages are freed behind the fence. */
  abortRequest(
    requestId: string,
    status: RequestStatus = 'FINISHED_ABORTED',
    error: HandoffError | null = null,
  ): boolean {
    const req = this.requests.get(requestId);
    if (!req || req.isFinished) return false;
    req.error = error;
    this.finish(req, status);
    return true;
  }

  hasUnfinishedRequests(): boolean {
    return this.waiting.length + this.running.length > 0;
  }
  /** Anything to do at all (requests, pages held for peers, pending frees). */
  hasWork(): boolean {
    return (
      this.hasUnfinishedRequests() ||
      this.connector.hasPendingWork() ||
      this.transfers.numHeld > 0 || // pages lent to the connector come back only through steps
      this.fence.numPending > 0 ||
      this.finishedSinceLast.length > 0
    );
  }
  get numRunning(): number {
    return this.running.length;
  }
  get numWaiting(): number {
    return this.waiting.length;
  }
  get numHeldForSend(): number {
    return this.transfers.numHeld;
  }

  schedule(): SchedulerOutput {
    const step = ++this.step;
    const ctx: StepBuild = { out: makeEmptySchedulerOutput(step), budget: this.config.maxNumBatchedTokens };
    const blocked = this.scheduleRunning(ctx);
    // No admissions while a running request waits for pages: they would take the pages it waits for.
    if (!blocked) this.scheduleWaiting(ctx);
    const out = ctx.out;
    // 3. Zeroing list, once, after admissions.
    out.newBlockIdsToZero = this.takeNewBlockIdsToZero();
    const before = out.newBlockIdsToZero?.length ?? 0;
    // 4. Connector metadata, then the zeroing exclusion of this step's READ destinations.
    out.kvConnectorMetadata = this.connector.buildConnectorMeta(out);
    out.newBlockIdsToZero = this.connector.excludeReadDestinations(out.newBlockIdsToZero, out.kvConnectorMetadata);
    const after = out.newBlockIdsToZero?.length ?? 0;
    this.stats.pagesZeroListed += after;
    this.stats.pagesExcludedFromZeroing += before - after;

    out.finishedReqIds = this.finishedSinceLast;
    out.preemptedReqIds = this.preemptedSinceLast;
    this.finishedSinceLast = [];
    this.preemptedSinceLast = [];
    this.fence.scheduled(step);

    // 5. One step ahead: advance computed tokens and placeholders now.
    for (const [id, n] of Object.entries(out.numScheduledTokens)) {
      const req = defined(this.requests.get(id), 'scheduled request');
      req.numComputedTokens += n;
      if (out.sampleAfter[id]) req.numOutputPlaceholders += 1;
    }
    return out;
  }

  /** 1. Running requests (decode steps, prefill chunks). Returns true when one waits for pages. */
  private scheduleRunning(ctx: StepBuild): boolean {
    let blocked = false;
    for (let i = 0; i < this.running.length && ctx.budget > 0; i++) {
      const req = defined(this.running[i], 'running request');
      let numNew = req.numTokensWithPlaceholders - req.numComputedTokens;
      if (numNew <= 0 || (req.numComputedTokens >= req.numTokens && !req.canSampleMore)) continue;
      numNew = Math.min(numNew, ctx.budget);
      const newBlocks = this.allocateOrPreempt(req, numNew);
      if (newBlocks === null) break; // req itself was preempted; everything after it was too
      if (newBlocks === 'wait') {
        blocked = true;
        continue;
      }
      const end = req.numComputedTokens + numNew;
      const known = end <= req.numTokens;
      assert(known || numNew === 1, `a step past the known tokens computes exactly one (got ${numNew})`);
      const data: CachedRequestData = {
        requestId: req.requestId,
        newBlockIds: newBlocks,
        numComputedTokens: req.numComputedTokens,
        newTokenIds: known ? req.allTokenIds.slice(req.numComputedTokens, end) : [],
        numOutputTokens: req.outputTokenIds.length + req.numOutputPlaceholders,
      };
      ctx.out.scheduledCachedReqs.push(data);
      this.noteScheduled(ctx, req, numNew);
      ctx.budget -= numNew;
    }
    return blocked;
  }

  /**
   * 2. Waiting requests in order, until the budget, the batch or the pages run out; page holders first,
   * and once one finds no pages only holders go on (waiting_order.ts, vLLM #57841).
   */
  private scheduleWaiting(ctx: StepBuild): void {
    const skipped: Request[] = [];
    let stuck: Request | null = null;
    this.waiting = holdersFirst(this.waiting, (r) => this.holdsPages(r));
    while (this.waiting.length > 0 && ctx.budget > 0 && this.running.length < this.config.maxNumSeqs) {
      const req = defined(this.waiting.shift(), 'waiting request');
      if (req.status === 'WAITING_FOR_REMOTE_KVS') {
        if (!this.transfers.takeRecvFinished(req.requestId)) {
          skipped.push(req);
          continue;
        }
        this.resumeAfterAsyncLoad(req);
      }
      const admitted = stuck !== null && !this.holdsPages(req) ? 'skip' : this.admit(req, ctx);
      if (admitted === 'no-pages') stuck ??= req;
      if (admitted === 'skip' || admitted === 'parked' || admitted === 'no-pages') skipped.push(req);
      else if (typeof admitted === 'number') ctx.budget -= admitted;
    }
    this.waiting.unshift(...skipped);
    if (stuck !== null && ctx.out.totalNumScheduledTokens === 0) this.unblockHead(stuck);
  }

  private holdsPages(req: Request): boolean {
    return this.kv.getBlockIds(req.requestId).some((g) => g.length > 0);
  }

  private noteScheduled(ctx: StepBuild, req: Request, numNew: number): void {
    const out = ctx.out;
    out.numScheduledTokens[req.requestId] = numNew;
    out.totalNumScheduledTokens += numNew;
    out.sampleAfter[req.requestId] =
      req.numComputedTokens + numNew >= req.numTokensWithPlaceholders && req.canSampleMore;
    const written = this.kv.cachedGroupBlockIdsFrom(req.requestId, req.numComputedTokens);
    this.inflight.note(out.step, req.requestId, req.epoch, written);
  }

  /**
   * Allocate for a running request. When out of pages: if freed pages are on their way back (behind the
   * fence), wait a step; otherwise preempt the newest running request, and stop after one preemption
   * whose pages are only deferred (preempting more would free nothing this step: a cascade that makes
   * no progress, vLLM #49674).
   */
  private allocateOrPreempt(req: Request, numNew: number): number[][] | 'wait' | null {
    for (;;) {
      // A request whose synchronous READ is still in flight (async scheduling: its load step is not
      // processed yet) must not publish its pages: the READ may fail, and a prefix hit would read stale bytes.
      const delayCacheBlocks = this.transfers.isSyncLoading(req.requestId);
      const blocks = this.kv.allocateSlots(this.tokensOf(req), numNew, {
        numLookaheadTokens: this.config.numLookaheadTokens,
        delayCacheBlocks,
      });
      if (blocks !== null) return blocks;
      if (this.fence.numPending > 0) return 'wait';
      const victim = this.running[this.running.length - 1];
      assert(victim !== undefined, 'running list cannot be empty while a running request allocates');
      this.preempt(victim);
      if (victim === req) return null;
      if (this.fence.numPending > 0) return 'wait';
    }
  }

  private preempt(req: Request): void {
    const idx = this.running.indexOf(req);
    assert(idx >= 0, 'only running requests are preempted');
    this.running.splice(idx, 1);
    this.resetForRecompute(req);
    this.waiting.unshift(req);
  }

  /** To be recomputed: pages behind the fence, progress and placeholders dropped. */
  private resetForRecompute(req: Request): void {
    this.fence.defer(this.kv.detach(req.requestId));
    req.status = 'PREEMPTED';
    req.numComputedTokens = 0;
    req.numOutputPlaceholders = 0;
    req.epoch = nextEpoch();
    req.numPreemptions++;
    this.stats.preemptions++;
    this.preemptedSinceLast.push(req.requestId);
  }

  /** Nothing runs, nothing is on its way back, the head finds no pages: recompute the newest idle holder. */
  private unblockHead(head: Request): void {
    if (this.running.length > 0 || this.fence.numPending > 0) return;
    const loadOver = (r: Request): boolean => this.transfers.takeRecvFinished(r.requestId);
    const victim = newestIdleHolder(this.waiting, head, (r) => this.holdsPages(r), loadOver);
    if (victim === null) return;
    if (victim.status === 'WAITING_FOR_REMOTE_KVS') this.resumeAfterAsyncLoad(victim);
    this.resetForRecompute(victim);
  }

  /** Try to admit a waiting request; returns tokens scheduled, or why not. */
  private admit(req: Request, ctx: StepBuild): number | 'skip' | 'no-pages' | 'parked' | 'failed' {
    const budget = ctx.budget;
    const tokens = this.tokensOf(req);
    let localBlocks: number[][] | undefined;
    let numLocal = req.numComputedTokens;
    // A request rolled back after a failed load keeps its pages: no prefix lookup for it.
    const fresh = numLocal === 0 && this.kv.getBlockIds(req.requestId).every((g) => g.length === 0);
    if (fresh && this.config.enablePrefixCaching) {
      const hit = this.kv.getComputedBlocks(tokens);
      localBlocks = hit.blocks;
      numLocal = hit.numComputedTokens;
    }
    const match = this.connector.getNumNewMatchedTokens(req, numLocal);
    if (match.numExternalTokens === null) return 'skip';
    assert(match.numExternalTokens >= 0, 'external tokens cannot be negative');
    const numExternal = match.numExternalTokens;
    assert(!(match.loadAsync && numExternal === 0), 'an async load must load something');
    const numComputed = numLocal + numExternal;
    assert(numComputed < req.numTokens || match.loadAsync, 'at least one token is computed locally');
    let numNew = match.loadAsync ? 0 : req.numTokens - numComputed;
    const over = !match.loadAsync && numNew > budget;
    // Unchunked, unless no step holds it (a preempted request recomputes prompt + outputs).
    if (over && !this.config.enableChunkedPrefill && numNew <= this.config.maxNumBatchedTokens) return 'no-pages';
    if (over) numNew = budget;
    const newBlocks = this.kv.allocateSlots(tokens, numNew, {
      numNewComputedTokens: fresh ? numLocal : 0,
      newComputedBlocks: fresh ? localBlocks : undefined,
      numExternalComputedTokens: numExternal,
      numLookaheadTokens: match.loadAsync ? 0 : this.config.numLookaheadTokens,
      // Published below, once the connector took the request; pages a load fills once it landed.
      delayCacheBlocks: true,
    });
    if (newBlocks === null) return 'no-pages';
    const allBlocks = this.kv.getBlockIds(req.requestId);
    try {
      this.connector.updateStateAfterAlloc(req, allBlocks, numExternal);
    } catch (e) {
      if (!(e instanceof HandoffError)) throw e;
      // Bad transfer params found only now (e.g. a decode tail beyond the allowed one): fail this request alone.
      req.error = e;
      req.status = 'WAITING';
      this.finish(req, 'FINISHED_ERROR');
      return 'failed';
    }
    if (!match.loadAsync && numExternal === 0) this.kv.cacheBlocks(tokens, numComputed + numNew);
    req.numExternalComputedTokens += numExternal;
    if (fresh) req.noteLocalHit(numLocal);
    if (match.loadAsync) {
      req.status = 'WAITING_FOR_REMOTE_KVS';
      this.transfers.asyncLoadStarted(req.requestId);
      req.numComputedTokens = numComputed;
      const skip = match.readExclusion ? [] : this.kv.getZeroingBlockIdsInRange(req.requestId, numLocal, numComputed);
      for (const b of skip) this.skipZeroBlockIds.add(b); // an async READ's: the connector's exclusion
      return 'parked';
    }
    return this.startRunning(req, ctx, allBlocks, numComputed, numExternal, numNew);
  }

  /** An admitted request joins the batch this step (after a synchronous READ of numExternal tokens, if any). */
  private startRunning(
    req: Request,
    ctx: StepBuild,
    allBlocks: number[][],
    numComputed: number,
    numExternal: number,
    numNew: number,
  ): number {
    const out = ctx.out;
    req.status = 'RUNNING';
    req.numComputedTokens = numComputed;
    this.running.push(req);
    const data: NewRequestData = {
      requestId: req.requestId,
      tokenIds: req.allTokenIds,
      numPromptTokens: req.numPromptTokens,
      blockIds: allBlocks,
      numComputedTokens: numComputed,
      sampling: req.sampling,
      numOutputTokens: req.outputTokenIds.length,
    };
    out.scheduledNewReqs.push(data);
    if (numExternal > 0) {
      out.hasSyncKvLoads = true;
      this.transfers.syncLoadStarted(req.requestId, out.step);
    }
    this.noteScheduled(ctx, req, numNew);
    return numNew;
  }

  /** An async load finished: the request becomes schedulable; on a full hit one token is recomputed. */
  private resumeAfterAsyncLoad(req: Request): void {
    if (this.config.enablePrefixCaching) this.kv.cacheBlocks(this.tokensOf(req), req.numComputedTokens);
    if (req.numComputedTokens >= req.numTokens) req.numComputedTokens = req.numTokens - 1;
    req.status = 'WAITING';
  }

  private takeNewBlockIdsToZero(): number[] | null {
    const ids = this.kv.takeNewBlockIds(); // always drain, so the list never grows
    const skip = this.skipZeroBlockIds;
    this.skipZeroBlockIds = new Set();
    if (!this.kv.config.needsKvCacheZeroing) return null;
    const kept = skip.size > 0 ? ids.filter((b) => !skip.has(b)) : ids;
    return kept.length > 0 ? kept : null;
  }

  private tokensOf(req: Request): RequestTokens {
    return { requestId: req.requestId, tokenIds: req.allTokenIds, numComputedTokens: req.numComputedTokens };
  }

  /** Apply one step's results. Returns per-request outputs (tokens, finishes, errors). */
  updateFromOutput(so: SchedulerOutput, result: ModelRunnerOutput): EngineOutput[] {
    assert(so.step === result.step, `output of step ${result.step} applied to step ${so.step}`);
    const inflight = this.inflight.take(so.step);
    const epochs = inflight.epochs;
    const conn = this.connector.updateConnectorOutput(result.kvConnectorOutput);
    const outputs: EngineOutput[] = [];

    const failed = new Set(conn.failedLoadReqIds);
    const host = this.failureHost();
    if (conn.invalidBlockIds.length > 0 || failed.size > 0) {
      failAsyncLoads(host, this.waiting, failed, conn.loadErrors ?? {});
      const invalid = new Set(conn.invalidBlockIds);
      failRunningLoads(host, [...this.running], invalid, failed, epochs, conn.loadErrors ?? {});
    }
    for (const [id, message] of Object.entries(result.forwardErrors ?? {}))
      failForward(host, so, id, message, inflight);
    for (const s of result.sampled) {
      const req = this.requests.get(s.requestId);
      if (!req || req.isFinished || epochs.get(s.requestId) !== req.epoch || failed.has(s.requestId)) continue;
      assert(req.numOutputPlaceholders > 0, `sampled token for ${s.requestId} without a placeholder`);
      req.numOutputPlaceholders--;
      req.outputTokenIds.push(s.tokenId);
      if (req.firstTokenMs === null) req.firstTokenMs = this.env.nowMs();
      const stop = stopStatusAfter(req, s.tokenId, this.config);
      if (stop) this.finish(req, stop);
      outputs.push(
        makeOutput(req, finishReasonOf(req.status), {
          token: s,
          kvTransferParams: req.isFinished ? req.finishedKvTransferParams : null,
        }),
      );
    }
    for (const id of this.transfers.takeSyncLoadsOf(so.step)) {
      const req = this.requests.get(id);
      if (req && !req.isFinished && !failed.has(id) && this.config.enablePrefixCaching) {
        this.kv.cacheBlocks(this.tokensOf(req), Math.min(req.numComputedTokens, req.numTokens));
      }
    }
    for (const id of conn.finishedRecving) this.transfers.recvFinished(id);
    for (const id of conn.finishedSending) {
      const blocks = this.transfers.release(id);
      if (blocks) this.fence.defer(blocks);
    }
    this.fence.processed(so.step);
    outputs.push(...this.drainPendingOutputs());
    return outputs;
  }

  /** What the failure handling (step_failures.ts) may touch. */
  private failureHost(): StepFailureHost {
    return {
      requests: this.requests,
      kv: this.kv,
      config: this.config,
      transfers: this.transfers,
      countFailure: () => this.stats.loadFailures++,
      finish: (req, status) => this.finish(req, status),
      abortRequest: (id, status, error) => this.abortRequest(id, status, error),
      requeue: (req) => {
        this.running.splice(this.running.indexOf(req), 1);
        req.status = 'PREEMPTED';
        this.preemptedSinceLast.push(req.requestId);
        this.waiting.unshift(req);
      },
    };
  }

  private finish(req: Request, status: RequestStatus): void {
    assert(status.startsWith('FINISHED_'), `finish needs a finished status, got ${status}`);
    const wasQueued = this.waiting.includes(req) || this.running.includes(req);
    this.running = this.running.filter((r) => r !== req);
    this.waiting = this.waiting.filter((r) => r !== req);
    req.status = status;
    const blocks = this.kv.getBlockIds(req.requestId);
    req.leaveSharedTransfer(this.requests.values()); // a live retry's transfer is not this one's to release
    const handoff = this.connector.requestFinished(req, blocks);
    req.finishedKvTransferParams = handoff.kvTransferParams;
    const detached = this.kv.detach(req.requestId);
    this.transfers.dropLoad(req.requestId);
    if (handoff.delayFree) this.transfers.hold(req.requestId, detached);
    else if (status === 'FINISHED_ABORTED' && !this.mutations.deferFreeOnAbort) this.kv.freeBlockIds(detached);
    else this.fence.defer(detached);
    if (wasQueued) this.finishedSinceLast.push(req.requestId);
    this.requests.delete(req.requestId);
    if (status === 'FINISHED_ABORTED' || status === 'FINISHED_ERROR') {
      this.pendingOutputs.push(
        makeOutput(req, finishReasonOf(status), { kvTransferParams: handoff.kvTransferParams, error: req.error }),
      );
    }
  }

  /** Outputs produced outside a step (aborts while idle). */
  drainPendingOutputs(): EngineOutput[] {
    const o = this.pendingOutputs;
    this.pendingOutputs = [];
    return o;
  }

  /** Leak check: no request, nothing held, nothing pending, and every page is back in the pool. */
  isQuiescent(): boolean {
    return (
      !this.hasUnfinishedRequests() &&
      this.transfers.numHeld === 0 &&
      this.kv.numRequests() === 0 &&
      this.fence.numPending === 0 &&
      this.fence.inFlightSteps === 0 &&
      this.kv.getNumFreeBlocks() === this.kv.config.numBlocks - 1 // the null block is never free
    );
  }
}
