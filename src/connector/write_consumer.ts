/**
 * WRITE consumer (decode, WRITE mode): one transfer per request waiting for the producer to push.
 *
 *   granted ──write_done──> done (finishedRecving)
 *      │  └──deadline──> expired (the load failed: recompute or fail by policy)
 *      └──request aborted──> aborted ──write_done or deadline──> aborted-released (finishedSending)
 *
 * `granted`: decode's pages are granted to the producer and it was told where to write (sent without
 * blocking the step). The grant is revoked on every way out, before the pages can be reused.
 */
import { isHandoffError } from '../util/errors.ts';
import type { KVConnectorOutput } from '../worker/scheduler_output.ts';
import type { NotifyReqMeta } from '../worker/connector_metadata.ts';
import { TransferTable } from './transfer_table.ts';
import type { WorkerContext } from './worker_context.ts';

type RecvState = 'granted' | 'aborted' | 'done' | 'expired' | 'aborted-released';
interface RecvTransfer {
  state: RecvState;
  requestId: string;
  deadlineMs: number;
  blockIds: number[];
}

const RECV_TRANSITIONS = {
  granted: ['done', 'expired', 'aborted'],
  aborted: ['aborted-released'],
  done: [],
  expired: [],
  'aborted-released': [],
} as const;

type LoadFailures = Pick<KVConnectorOutput, 'failedLoadReqIds' | 'invalidBlockIds' | 'loadErrors'>;

export class WriteConsumer {
  private readonly recvs = new TransferTable<RecvState, RecvTransfer>('WRITE consumer', RECV_TRANSITIONS, 1 << 16);
  /** Outbox: aborted requests whose load had already ended (their pages may be freed). */
  private releaseNow: string[] = [];

  constructor(private readonly ctx: WorkerContext) {}

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
    } = n;
    // Only the pages after decode's prefix hit are granted (attention groups; Mamba groups have no hit).
    const writable = local.map((ids, g) => (g < this.ctx.numAttnGroups ? ids.slice(skipBlocks) : ids));
    const now = this.ctx.env.nowMs();
    const t = this.recvs.add(transferId, {
      state: 'granted',
      requestId,
      deadlineMs: now + this.ctx.config.transferTimeoutMs,
      blockIds: writable.flat(),
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
    const grant = this.ctx.transfer.issueGrant({
      transferId,
      peerEngineId: engineId,
      blockIds: writable.flat(),
      ttlMs: this.ctx.config.leaseMs,
    });
    const payload = { blockIds: local, skipBlocks, grant: grant.token };
    this.ctx.transfer.notify(engineId, { type: 'remote_blocks', transferId, payload }).catch((e: unknown) => {
      if (!isHandoffError(e)) throw e;
      this.ctx.log?.warn(
        { requestId, transferId, err: e.message },
        'could not tell the producer where to write; the load fails at its deadline',
      );
    });
  }

  /**
   * The request finished (aborted) while the producer may still write: no new WRITE is accepted into
   * its pages; they are released when write_done arrives or the deadline passes. A request whose
   * producer was never told where to write (or whose load already ended) is released at the next collect.
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
    if (t?.state === 'granted') this.recvs.move(transferId, 'aborted');
    // Never told where to write, or its load already ended: nothing can land.
    else if (t === undefined || t.state === 'done' || t.state === 'expired') this.releaseNow.push(requestId);
  }

  /** The producer's data is visible in our pages. */
  writeDone(transferId: string): void {
    const t = this.recvs.get(transferId);
    if (t === undefined || (t.state !== 'granted' && t.state !== 'aborted')) return;
    this.ctx.transfer.revokeGrant(transferId);
    this.recvs.move(transferId, t.state === 'aborted' ? 'aborted-released' : 'done');
  }

  /** Loads past their deadline (vLLM's get_block_ids_with_load_errors), then what finished. */
  collect(): { finishedRecving: string[]; releasedAborted: string[]; loads: LoadFailures } {
    const loads: LoadFailures = { failedLoadReqIds: [], invalidBlockIds: [], loadErrors: {} };
    const now = this.ctx.env.nowMs();
    const done = this.recvs.take('done').map(([, t]) => t.requestId);
    const releasedAborted = [...this.releaseNow, ...this.recvs.take('aborted-released').map(([, t]) => t.requestId)];
    this.releaseNow = [];
    for (const [transferId, t] of [...this.recvs.entries()]) {
      if (t.deadlineMs > now || (t.state !== 'granted' && t.state !== 'aborted')) continue;
      this.ctx.transfer.revokeGrant(transferId); // stop accepting the producer's WRITEs into these pages first
      if (t.state === 'aborted') {
        this.recvs.move(transferId, 'aborted-released'); // past the deadline no WRITE of the producer lands
        continue;
      }
      this.recvs.move(transferId, 'expired');
      loads.failedLoadReqIds.push(t.requestId);
      loads.invalidBlockIds.push(...t.blockIds);
      loads.loadErrors[t.requestId] = {
        code: 'TIMEOUT',
        message: `the producer did not write within ${this.ctx.config.transferTimeoutMs} ms`,
      };
    }
    this.recvs.take('expired');
    releasedAborted.push(...this.recvs.take('aborted-released').map(([, t]) => t.requestId));
    return { finishedRecving: done, releasedAborted, loads };
  }
}
