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
 */
import type { HandoffError } from '../util/errors.ts';
import { isHandoffError } from '../util/errors.ts';
import { rethrowIfAssertion } from '../util/assert.ts';
import type { TransferHandle } from '../transfer/core/types.ts';
import type { LoadResult } from '../worker/hooks.ts';
import type { RecvReqMeta } from '../worker/connector_metadata.ts';
import { TransferTable } from './transfer_table.ts';
import type { WorkerContext } from './worker_context.ts';

type ReadState = 'posted' | 'landed' | 'failed' | 'late';
interface ReadTransfer {
  state: ReadState;
  r: RecvReqMeta;
  handle: TransferHandle | null;
  error: HandoffError | null;
}

const READ_TRANSITIONS = { posted: ['landed', 'failed', 'late'], late: ['landed'], landed: [], failed: [] } as const;
export const READS_MAX = 4096;

export class ReadConsumer {
  private readonly reads = new TransferTable<ReadState, ReadTransfer>('READ consumer', READ_TRANSITIONS, READS_MAX);
  private postedAtMs = 0;
  /** Latency of each request's READs (post → landed, ms), drained by the metrics; bounded. */
  private latenciesMs: number[] = [];
  stats = { readsPosted: 0, readsFailed: 0, releasesSent: 0, releasesFailed: 0, hostSyncWaits: 0 };

  constructor(private readonly ctx: WorkerContext) {}

  get numInFlight(): number {
    return this.reads.size;
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
    this.postedAtMs = this.ctx.env.nowMs();
    for (const r of reqs) this.reads.add(r.requestId, this.post(r, step));
  }

  private post(r: RecvReqMeta, step: number): ReadTransfer {
    if (r.localBlockIds.every((g) => g.length === 0)) return { state: 'landed', r, handle: null, error: null };
    try {
      const peerEngineId = this.ctx.peers.readyEngine(r.remoteHost, r.remotePort, r.remoteEngineId);
      const { ranges, footprint } = this.ctx.rangesFor(r.localBlockIds, r.remoteBlockIds);
      this.stats.readsPosted++;
      const handle = this.ctx.transfer.postRead({
        peerEngineId,
        transferId: r.transferId,
        grantToken: r.grant,
        ranges,
        label: { what: 'kv-read', requestIds: [r.requestId], step },
        footprint,
      });
      // Mutant read-done-early: the local ack of the post taken for the data having landed.
      return { state: this.ctx.mutations.readDoneWhenLanded ? 'posted' : 'landed', r, handle, error: null };
    } catch (e) {
      if (!isHandoffError(e)) throw e;
      return { state: 'failed', r, handle: null, error: e };
    }
  }

  /**
   * Await every READ posted this step (vLLM #60808: unconditional), with one deadline for the step;
   * report the failed ones and release every one.
   */
  async awaitReadsIssuedThisStep(): Promise<LoadResult> {
    const result: LoadResult = { failedReqIds: [], invalidBlockIds: [], loadErrors: {} };
    const deadlineMs = this.ctx.env.nowMs() + this.ctx.config.transferTimeoutMs;
    // In posting order: each READ is settled, reported if it failed, and released before the next.
    for (const [id, t] of [...this.reads.entries()]) {
      if (t.state === 'late') continue;
      if (t.state === 'posted') await this.settle(id, t, deadlineMs);
      if (t.state === 'failed') this.report(t, result);
      this.reads.delete(id);
      this.release(t.r);
    }
    return result;
  }

  private async settle(id: string, t: ReadTransfer, deadlineMs: number): Promise<void> {
    try {
      await this.ctx.transfer.wait([t.handle as TransferHandle], Math.max(0, deadlineMs - this.ctx.env.nowMs()));
      if (this.latenciesMs.length < 4096) this.latenciesMs.push(this.ctx.env.nowMs() - this.postedAtMs);
      this.reads.move(id, 'landed');
    } catch (e) {
      if (!isHandoffError(e)) throw e;
      await this.ctx.transfer.abort([t.handle as TransferHandle]); // the NIC must not touch the pages any more
      t.error = e;
      this.reads.move(id, 'failed');
    }
  }

  private report(t: ReadTransfer, result: LoadResult): void {
    const error = t.error as HandoffError;
    this.stats.readsFailed++;
    // The side channel to that peer is gone: handshake again (for the release and the next READ).
    if (error.code === 'PEER_UNAVAILABLE') this.ctx.peers.forget(t.r.remoteHost, t.r.remotePort);
    this.ctx.log?.warn({ requestId: t.r.requestId, code: error.code, err: error.message }, 'KV READ failed');
    result.failedReqIds.push(t.r.requestId);
    result.invalidBlockIds.push(...t.r.localBlockIds.flat());
    result.loadErrors[t.r.requestId] = { code: error.code, message: error.message };
  }

  /** Mutant `no-await-reads` only: the step's READs are left in flight while its forward is enqueued. */
  leaveReadsInFlight(): LoadResult {
    for (const [id] of this.reads.inState('posted')) this.reads.move(id, 'late');
    for (const [, t] of [...this.reads.take('landed'), ...this.reads.take('failed')]) this.release(t.r);
    return { failedReqIds: [], invalidBlockIds: [], loadErrors: {} };
  }

  /** After the forward: READs left in flight by the mutant are awaited and released. */
  async settleLateReads(): Promise<void> {
    for (const [id, t] of this.reads.inState('late')) {
      await this.ctx.transfer
        .wait([t.handle as TransferHandle], this.ctx.config.transferTimeoutMs)
        .catch((e: unknown) => rethrowIfAssertion(e));
      this.reads.move(id, 'landed');
    }
    for (const [, t] of this.reads.take('landed')) this.release(t.r);
  }

  /** Tell the producer it may free its pages (also after a failure or an empty READ). */
  private release(r: RecvReqMeta): void {
    // Off the step path: a refused request's release may be the first contact with that producer.
    this.ctx.peers
      .resolve(r.remoteHost, r.remotePort, r.remoteEngineId)
      .then((engineId) =>
        this.ctx.transfer.notify(engineId, { type: 'release', transferId: r.transferId, payload: { grant: r.grant } }),
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
