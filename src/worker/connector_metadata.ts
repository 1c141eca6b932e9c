/**
 * Per-step connector metadata: plain data from the connector's scheduler side to its worker side (vLLM's
 * KVConnectorMetadata). It lives with the runner, which carries it in SchedulerOutput, so both sides
 * share one type instead of an `unknown` cast.
 */

/**
 * READ consumer: pull these pages this step. Lists are per transfer group (attention groups, then Mamba):
 * tokens [start, end) of tokenRuns[g] move from the remote pages to the local ones (token t <-> token t;
 * the two sides' block sizes may differ), a Mamba group's state page moves whole.
 */
export interface RecvReqMeta {
  requestId: string;
  transferId: string;
  /** Destination pages (decode), in token order: the first holds token floor(start / blockSize) * blockSize. */
  localBlockIds: number[][];
  /** Source pages (prefill), in token order, in prefill's block size. */
  remoteBlockIds: number[][];
  tokenRuns: Array<[start: number, end: number]>;
  /** prefill's tokens per page (remote_block_ids are in these units). */
  remoteBlockSize: number;
  remoteEngineId: string;
  remoteHost: string;
  remotePort: number;
  grant: string;
  /** When prefill's lease (and grant) ends, wall-clock ms (kv_transfer_params.grant_expires_ms); null: unknown. */
  grantExpiresMs?: number | null;
  /**
   * This engine's monotonic ms (env.nowMs()) by which prefill's lease has surely ended: the request's
   * arrival here plus grant_ttl_ms (it was issued before it arrived). Free of clock skew between hosts.
   */
  grantLapsesAtMs?: number | null;
  /** An async READ (asyncRead): the step does not wait for it; it is reported through finishedRecving. */
  async?: boolean;
}

/** WRITE producer: this finished request's pages are final and may be pushed once decode's pages are known. */
export interface SaveReqMeta {
  requestId: string;
  transferId: string;
  localBlockIds: number[][];
}

/** WRITE consumer: tell the producer where to write (and grant it those pages). */
export interface NotifyReqMeta {
  requestId: string;
  transferId: string;
  /** Every page of the request per transfer group, from its token 0 (decode's block size). */
  localBlockIds: number[][];
  /** Leading pages of each attention group that are decode's local prefix hit: never written. */
  skipBlocks: number;
  /**
   * The WRITE covers tokens [skipBlocks * blockSize, endToken): what prefill's pages hold, clipped to
   * decode's. The slots of decode's last page past it are zeroed once the WRITE landed.
   */
  endToken: number;
  remoteEngineId: string;
  remoteHost: string;
  remotePort: number;
}

export interface OneSidedMetadata {
  reqsToRecv: RecvReqMeta[];
  reqsToSave: SaveReqMeta[];
  reqsToNotify: NotifyReqMeta[];
  /** Producer: transfer id → request id of every request whose pages are held for a peer. */
  sendTransfers: Record<string, string>;
  /**
   * Producer: transfer id → request id of leases that expired this step. The scheduler frees their pages
   * only once the worker reports them in finishedSending: READ, once the NIC no longer sends from them (a
   * reply under way when the grant ended); WRITE, at once when no push of them runs, after it otherwise
   * (the worker may have started one before it saw this).
   */
  expiring: Record<string, string>;
  /**
   * WRITE consumer: requests that finished (aborted) while the producer may still be writing their
   * pages. The worker revokes the grant and reports them in finishedSending once no WRITE can land.
   */
  abortedRecvs: Array<{ requestId: string; transferId: string }>;
}

/** The metadata a step carries (one connector kind today). */
export type KVConnectorMetadata = OneSidedMetadata;

export function emptyOneSidedMetadata(): OneSidedMetadata {
  return {
    reqsToRecv: [],
    reqsToSave: [],
    reqsToNotify: [],
    sendTransfers: {},
    expiring: {},
    abortedRecvs: [],
  };
}
