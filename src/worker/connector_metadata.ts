/**
 * Per-step connector metadata: plain data from the connector's scheduler side to its worker side (vLLM's
 * KVConnectorMetadata). It lives with the runner, which carries it in SchedulerOutput, so both sides
 * share one type instead of an `unknown` cast.
 */

/** READ consumer: pull these pages this step. Lists are per transfer group (attention groups, then Mamba). */
export interface RecvReqMeta {
  requestId: string;
  transferId: string;
  localBlockIds: number[][];
  remoteBlockIds: number[][];
  remoteEngineId: string;
  remoteHost: string;
  remotePort: number;
  grant: string;
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
  /** Every page of the request per transfer group; page i receives the producer's page i. */
  localBlockIds: number[][];
  /** Leading pages of each attention group that are decode's local prefix hit: never written. */
  skipBlocks: number;
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
  /** Producer: transfers whose lease expired this step (grant to revoke). */
  expiredTransfers: string[];
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
    expiredTransfers: [],
    abortedRecvs: [],
  };
}
