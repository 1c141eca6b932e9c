/**
 * The transfer engine's contract: registered KV slabs, grants, one-sided READ/WRITE work requests,
 * and a side channel for handshakes and notifications. Every backend (inproc, tcp, sim) implements
 * `TransferEngine` and passes the same conformance suite (testing/conformance.ts).
 *
 *   consumer host --postRead--> consumer NIC --READ--> serving NIC (checks the grant, reads its slabs)
 *        ^  poll/wait                 |  writes the bytes straight into the consumer's SharedArrayBuffers
 *        +---- completion queue <-----+  (never waits for the compute stream, like an RDMA NIC)
 *
 * Everything here is plain, serialisable data except the engine itself.
 */
import type { OpLabel, PageAccess, RaceCheckerLike } from '../../device/types.ts';
import type { Env } from '../../util/env.ts';
import type { HandoffError } from '../../util/errors.ts';
import type { PageFormat } from '../../kv/token_map.ts';

export type TransferBackend = 'inproc' | 'tcp' | 'sim';

/** Where a peer's side channel listens. inproc: `{ host: 'inproc://<engineId>', port: 0 }`. */
export interface PeerAddress {
  host: string;
  port: number;
  /**
   * Ask the peer itself, not a cached answer (a backend may answer a handshake from an open side channel
   * to that address): the peer directory's refresh when a request names another engine there.
   */
  fresh?: boolean;
}

/**
 * Shape of the registered slabs: numSlabs slabs of numBlocks pages of pageBytes each. With tensor
 * parallel ranks every rank registers its own slabs, rank-major: slab index = rank * (numSlabs / TP) +
 * layer slab, and rank r's page holds rank r's share of the KV heads (kv/spec.ts, kv/tp_layout.ts). Two
 * engines of the same TP copy slab i to slab i: each rank's pages go to the same rank on the other side;
 * between different degrees a range names the slab on each side (TransferRange.remoteSlab).
 */
export interface SlabLayout {
  numSlabs: number;
  numBlocks: number;
  pageBytes: number;
  /** Tensor parallel ranks the slabs belong to (default 1). */
  tensorParallelSize?: number;
}

/**
 * What peers exchange at handshake. Peers are compatible when model, preset, slabs and specs agree and
 * their geometries can be mapped (core/metadata.ts compatibilityProblem); numBlocks may differ.
 */
export interface EngineMetadata {
  engineId: string;
  modelName: string;
  preset: string;
  /** The seed the model's weights are drawn from (absent for a bare engine): peers must hold the same weights. */
  weightSeed?: number;
  /**
   * pageFormats: per group, absent for a bare engine (then pages are copied whole); tpSplits: per group,
   * the units its whole cache splits into over ranks (0: replicated), for peers of another degree.
   */
  layout: Required<SlabLayout> & { blockSizes: number[]; pageFormats?: PageFormat[]; tpSplits?: number[] };
  /** sha256 over model, preset, weight seed, numSlabs, page formats, tensorParallelSize and the caller's cacheHash. */
  compatHash: string;
}

export interface GrantRequest {
  transferId: string;
  /** The only engine allowed to use the grant; null = any engine that holds the token. */
  peerEngineId: string | null;
  /** Pages (in every slab) the grant covers. */
  blockIds: number[];
  ttlMs: number;
}

export interface Grant {
  /** Hex of 16 random bytes from env.secureRandomBytes. */
  token: string;
  transferId: string;
  /** In env.nowMs() time. */
  expiresAtMs: number;
}

/**
 * One byte range: `localOffset` in this engine's slab `slab`, `remoteOffset` in the peer's slab
 * `remoteSlab` (absent: the same index; they differ between engines of different TP degrees).
 */
export interface TransferRange {
  slab: number;
  localOffset: number;
  remoteOffset: number;
  length: number;
  remoteSlab?: number;
}

/**
 * A READ (remote -> local) or WRITE (local -> remote). The grant was issued by the side whose pages
 * are the remote ones: the producer for a READ, the consumer (destination) for a WRITE.
 */
export interface TransferRequest {
  peerEngineId: string;
  transferId: string;
  grantToken: string;
  ranges: TransferRange[];
  label: OpLabel;
  /** Local pages this work request touches (READ: written; WRITE: read), for the race checker. */
  footprint: PageAccess[];
}

/** Returned by postRead/postWrite. Plain data; the engine keeps the state. */
export interface TransferHandle {
  readonly id: number;
  readonly kind: 'read' | 'write';
  readonly peerEngineId: string;
  readonly transferId: string;
  readonly bytes: number;
  /** Work request descriptors after coalescing contiguous ranges. */
  readonly descriptors: number;
}

export type PollResult = { state: 'pending' } | { state: 'done' } | { state: 'failed'; error: HandoffError };

/** write_refused: prefill will never push a transfer decode said where to write (its save is gone). */
export const NOTIFICATION_TYPES = ['release', 'write_done', 'remote_blocks', 'write_refused'] as const;
export type NotificationType = (typeof NOTIFICATION_TYPES)[number];

export interface Notification {
  type: NotificationType;
  transferId: string;
  /** Plain JSON data (e.g. remote_blocks: { blockIds }). */
  payload?: Record<string, unknown>;
}

/**
 * `grantEnded`: for a release / write_done / write_refused, whether it ended a live grant of this engine (false:
 * no grant was live under its transfer id, e.g. a duplicate, a late or a made-up one; a wrong token never gets
 * here).
 */
export type NotificationHandler = (fromEngineId: string, notification: Notification, grantEnded: boolean) => void;

export interface TransferStats {
  bytesRead: number;
  bytesWritten: number;
  readsPosted: number;
  readsFailed: number;
  writesPosted: number;
  writesFailed: number;
  /** Work request descriptors posted after coalescing (vLLM's num_descriptors). */
  descriptorsPosted: number;
  grantsIssued: number;
  /** READs/WRITEs this engine's NIC refused with GRANT_DENIED. */
  grantsRefused: number;
  grantsExpired: number;
  handshakesRefused: number;
  notificationsSent: number;
  notificationsFailed: number;
  /** release / write_done notifications refused: wrong peer or wrong grant token for a live grant. */
  releasesRefused: number;
  /** Data-plane connections closed because of malformed frames (tcp). */
  badFrames: number;
  /** readv calls that received payload straight into pages (tcp scatter receive, READ replies and WRITEs). */
  scatterReads: number;
  /** WRITEs into this engine stopped mid-payload because their grant was revoked (tcp: denied, nothing more lands). */
  writesCut: number;
}

/** Test-only fault switch; off unless configured. Decisions use env.rng. */
export interface TransferFaults {
  /** Probability that a posted READ fails with TRANSFER_FAILED (nothing is moved). */
  readErrorRate?: number;
  /** The NIC starts each READ this much later (a slow NIC). */
  readDelayMs?: number;
  /** Probability that an outgoing notification is lost; notify() then rejects with TIMEOUT. */
  dropNotificationRate?: number;
  /** Bug zoo only (mutant slot-leak-on-fail): a failed work request never frees its completion-queue slot. */
  leakFailedSlots?: boolean;
}

export interface TransferEngineOptions {
  backend: TransferBackend;
  env: Env;
  engineId: string;
  modelName: string;
  preset: string;
  layout: SlabLayout;
  /** Block size (tokens per page) per KV cache group. */
  blockSizes: number[];
  /** Page format per KV cache group; lets a peer with other block sizes map tokens (kv/token_map.ts). */
  pageFormats?: PageFormat[];
  /** Per group: how its cache splits over ranks (0: replicated); lets a peer of another degree map heads. */
  tpSplits?: number[];
  /** Extra compatibility input, e.g. a hash of the cache group specs. */
  cacheHash?: string;
  /** The model's weight seed: a peer with other weights is refused (its KV would mean other tokens). */
  weightSeed?: number;
  /** The registered regions: one SharedArrayBuffer per slab, numBlocks * pageBytes long. */
  slabs: SharedArrayBuffer[];
  /** tcp: interface to bind (default 127.0.0.1). */
  host?: string;
  /** tcp: side-channel port (0 = pick a free one). */
  port?: number;
  /** tcp: data-plane port served by the NIC thread (0 = pick a free one). */
  dataPort?: number;
  /** When set, handshakes must prove knowledge of it (HMAC challenge, both directions). */
  sideChannelSecret?: string;
  faults?: TransferFaults;
  /** Work requests in flight at once (completion queue slots). Default 1024. */
  inflightMax?: number;
  /** notify() rejects with TIMEOUT when the peer has not acknowledged by then. Default 5000. */
  notifyTimeoutMs?: number;
  /** handshake() rejects with PEER_UNAVAILABLE when it has not completed by then. Default 5000. */
  handshakeTimeoutMs?: number;
  /** tcp: payload bytes per DATA frame. Default 4 MiB. */
  dataFrameBytes?: number;
  /**
   * tcp: a READ's destination segments at least this long are read by the kernel straight into the slab;
   * shorter ones arrive in a reused buffer and are copied. Default 64 KiB.
   */
  recvDirectMinBytes?: number;
  /**
   * tcp: a READ's payload is received with readv(2) straight into its destination pages, many pages per
   * call (the native addon, native/scatter_read.c). Default true when the addon is built; false, or no
   * addon, receives as recvDirectMinBytes says.
   */
  scatterRecv?: boolean;
  /**
   * tcp: a READ of at least `laneMinBytes` is cut into `lanes` parts of equal bytes, each carried by its
   * own connection to the peer (lanes). Defaults 1 (off: on 2 cores 2-4 lanes moved no more than one
   * connection, README) and 8 MiB.
   */
  lanes?: number;
  laneMinBytes?: number;
}

export interface TransferEngine {
  readonly backend: TransferBackend;
  readonly engineId: string;
  readonly metadata: EngineMetadata;
  /** The address peers pass to handshake(). */
  address(): PeerAddress;
  /** Bound ports (tcp); zeros for inproc. */
  ports(): { sideChannel: number; data: number };
  attachRaceChecker(rc: RaceCheckerLike | null): void;

  issueGrant(req: GrantRequest): Grant;
  /** True when a live grant was revoked. */
  revokeGrant(transferId: string): boolean;
  /**
   * After revokeGrant: settles once this engine's NIC no longer touches the transfer's pages (a READ
   * reply or WRITE still being sent when the grant ended); then they may be freed.
   */
  drainGrant(transferId: string): Promise<void>;

  /** Metadata exchange, once per peer; PEER_INCOMPATIBLE, UNAUTHORIZED or PEER_UNAVAILABLE on failure. */
  handshake(peer: PeerAddress): Promise<EngineMetadata>;
  /** What a peer sent at a handshake (either direction), or null if none completed. */
  peerMetadata(peerEngineId: string): EngineMetadata | null;
  postRead(req: TransferRequest): TransferHandle;
  postWrite(req: TransferRequest): TransferHandle;
  poll(handle: TransferHandle): PollResult;
  /**
   * Resolves when every handle is done; rejects with the first failure's error, or on timeout with
   * KV_READ_TIMEOUT (TIMEOUT when only WRITEs are pending). A timeout does not stop the NIC: use abort().
   */
  wait(handles: readonly TransferHandle[], timeoutMs: number): Promise<void>;
  /** Resolves once the NIC will not touch memory for these work requests any more (each ends done or failed). */
  abort(handles: readonly TransferHandle[]): Promise<void>;

  /** Resolves when the peer acknowledged delivery; rejects with PEER_UNAVAILABLE or TIMEOUT. */
  notify(peerEngineId: string, notification: Notification): Promise<void>;
  /** Returns an unsubscribe function. Handler exceptions are logged, never rethrown. */
  onNotification(handler: NotificationHandler): () => void;

  stats(): TransferStats;
  close(): Promise<void>;
}
