/**
 * OneSidedConnector, scheduler side (MoRIIO-like). Producer (prefill) holds a finished request's pages,
 * grants them to one peer and returns kv_transfer_params; consumer (decode) loads N-1 prompt tokens
 * from the producer: READ = synchronous pull posted by the host before the forward, WRITE = the
 * producer pushes and the request waits in WAITING_FOR_REMOTE_KVS.
 *
 * Transfer groups: attention groups in group order, then Mamba groups reduced to their running state page.
 * Per step: updateStateAfterAlloc fills `reqsNeedRecv` with the ALIGNED destinations; buildConnectorMeta
 * turns them into metadata, applies the zeroing exclusion (zero_exclusion.ts), and clears them.
 *
 * Block sizes may differ between the two sides (issue 14): prefill's remote_block_ids are in its block
 * size (the handshake's, or remote_block_size of the params before the handshake); alignment is in
 * tokens (alignment.ts, read_plan.ts).
 */
import { assert, defined } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import type { KVCacheConfig } from '../kv/spec.ts';
import { emptyConnectorOutput, type KVConnectorOutput, type SchedulerOutput } from '../worker/scheduler_output.ts';
import { cdiv } from './alignment.ts';
import { checkReadParams, checkRemoteBlocks, emptyPlan, planRead, type ReadPlan } from './read_plan.ts';
import type { ConnectorRequest, ConnectorScheduler, FinishedHandoff, MatchedTokens } from './base.ts';
import { ASYNC_READS_MAX, type OneSidedConfig } from './config.ts';
import {
  emptyOneSidedMetadata,
  type NotifyReqMeta,
  type OneSidedMetadata,
  type RecvReqMeta,
  type SaveReqMeta,
} from '../worker/connector_metadata.ts';
import { remoteBlockIdsPerGroup, type KVTransferParams } from './params.ts';
import { excludeReadDestinations } from './zero_exclusion.ts';
import type { PeerDirectory } from './peer_directory.ts';
import { refuseLent, TransferTable } from './transfer_table.ts';
import { mutationsFor, type Mutations } from '../util/mutants.ts';

/** What the scheduler side needs of the transfer engine (the producer grants its pages). */
export interface GrantIssuer {
  issueGrant(g: { transferId: string; peerEngineId: string | null; blockIds: number[]; ttlMs: number }): {
    token: string;
    expiresAtMs: number;
  };
  revokeGrant(transferId: string): void;
}

export interface LocalEndpoint {
  engineId: string;
  host: string;
  port: number;
}

interface SideTransfer {
  state: 'held' | 'expiring' | 'async-loading' | 'recv-aborted';
  transferId: string;
  /** held: when the lease ends. */
  deadlineMs: number;
}

export class OneSidedConnectorScheduler implements ConnectorScheduler {
  readonly name = 'OneSidedConnector';
  /** Group ids in transfer order: attention groups, then Mamba groups. */
  readonly transferGroupIds: number[];
  readonly numAttnGroups: number;
  readonly hasMamba: boolean;
  readonly blockSize: number;
  private reqsNeedRecv = new Map<string, RecvReqMeta>();
  /** This step's READ requests → the pages excluded from zeroing for them (their aligned destinations). */
  private readonly zeroExcluded = new Map<string, number[][]>();
  private readonly mutations: Mutations;
  private reqsNeedNotify = new Map<string, NotifyReqMeta>();
  private reqsNeedSave = new Map<string, SaveReqMeta>();
  /**
   * Per request, the transfer this side tracks across steps: `held` (producer: pages lent to a peer
   * until released or the lease ends), `expiring` (producer: the lease ended, the pages wait for the
   * worker to say nothing reads them any more), `async-loading` (WRITE consumer: the producer may still
   * write) or `recv-aborted` (WRITE consumer: finished while loading; its pages wait for the worker to say
   * no WRITE can land any more, reported in finishedSending). All end by removal: release/lease/finish
   * of the load, the worker's report.
   */
  private readonly transfers = new TransferTable<SideTransfer['state'], SideTransfer>(
    'connector scheduler',
    { held: [], expiring: [], 'async-loading': [], 'recv-aborted': [] },
    1 << 20,
  );
  private abortedRecvs: Array<{ requestId: string; transferId: string }> = [];
  private readonly asyncReads = new Set<string>(); // async READs the worker holds (loading, aborted): bounded
  private expiring: Record<string, string> = {};
  stats = { leasesExpired: 0, holdsEnded: 0, readRequests: 0, grantsIssued: 0 };

  constructor(
    readonly config: OneSidedConfig,
    readonly kvConfig: KVCacheConfig,
    private readonly env: Env,
    private readonly endpoint: LocalEndpoint,
    private readonly grants: GrantIssuer | null,
    readonly numLookaheadTokens = 0,
    /** The consumer's producers (handshakes off the step path, allow-list); null in scheduler-only tests. */
    private readonly peers: PeerDirectory | null = null,
  ) {
    const attn = kvConfig.groups.filter((g) => g.spec.type !== 'mamba').map((g) => g.groupId);
    const mamba = kvConfig.groups.filter((g) => g.spec.type === 'mamba').map((g) => g.groupId);
    this.transferGroupIds = [...attn, ...mamba];
    this.numAttnGroups = attn.length;
    this.hasMamba = mamba.length > 0;
    this.blockSize = defined(kvConfig.groups[attn[0] ?? 0], 'first group').spec.blockSize;
    if (this.hasMamba && config.mode === 'write') {
      throw new HandoffError(
        'BAD_CONFIG',
        'models with Mamba layers support READ mode only; set kv_connector_extra_config.read_mode=true',
      );
    }
    if (this.isProducer) assert(grants !== null, 'a producer needs a grant issuer');
    this.mutations = mutationsFor(config.mutant);
  }

  get isProducer(): boolean {
    return this.config.role !== 'consumer';
  }
  get isConsumer(): boolean {
    return this.config.role !== 'producer';
  }
  /** Decode may have up to this many trailing pages prefill never had (last token + lookahead). */
  get maxDecodeTailBlocks(): number {
    return cdiv(1 + this.numLookaheadTokens, this.blockSize);
  }

  /** Prompt the prefill side computes: hybrids publish h(N-1), so decode can derive h(N) itself. */
  prefillPromptTokens(promptTokenIds: readonly number[], params: KVTransferParams | null): number[] {
    if (this.isProducer && this.hasMamba && params?.do_remote_decode && promptTokenIds.length > 1) {
      return promptTokenIds.slice(0, -1);
    }
    return [...promptTokenIds];
  }

  /**
   * A prefill half (do_remote_decode) samples one token, whatever its client asked: each further token
   * would be computed into the pages it lends, so their list outgrew the prompt (decode refused it with a
   * 400), and a hybrid's Mamba state page moved past the h(N-1) decode takes it for (a wrong answer).
   */
  prefillMaxTokens(maxTokens: number, params: KVTransferParams | null): number {
    // Math.min: a bad value stays bad for the engine's own check (max_tokens 0 is refused, not made 1).
    return this.isProducer && params?.do_remote_decode ? Math.min(maxTokens, 1) : maxTokens;
  }

  /** Check a request's params before it is admitted; throws BAD_TRANSFER_PARAMS and allocates nothing. */
  validateRequest(req: ConnectorRequest): void {
    const p = req.kvTransferParams;
    if (this.isProducer && p?.do_remote_decode) refuseLent(this.transfers, p.transfer_id ?? `xfer-${req.requestId}`);
    if (!p?.do_remote_prefill) return;
    if (!this.isConsumer)
      throw new HandoffError('BAD_TRANSFER_PARAMS', 'this instance is a producer; do_remote_prefill is not accepted');
    const missing = ['remote_engine_id', 'remote_host', 'remote_port', 'transfer_id'].filter(
      (k) => p[k] === undefined || p[k] === null,
    );
    if (this.config.mode === 'read') {
      if (p.remote_block_ids === undefined || p.remote_block_ids === null) missing.push('remote_block_ids');
      if (!p.grant) missing.push('grant');
    }
    if (missing.length > 0)
      throw new HandoffError('BAD_TRANSFER_PARAMS', `kv_transfer_params missing ${missing.join(', ')}`);
    // Before anything else is done with it: a producer outside the allow-list is never contacted.
    this.peers?.checkAllowed(String(p.remote_host), Number(p.remote_port));
    if (this.config.mode === 'write') return;
    checkReadParams(p, req.numPromptTokens, {
      numGroups: this.transferGroupIds.length,
      numAttnGroups: this.numAttnGroups,
      hasMamba: this.hasMamba,
      remoteBlockSize: this.remoteBlockSize(p),
    });
  }

  getNumNewMatchedTokens(req: ConnectorRequest, numComputedTokens: number): MatchedTokens {
    const p = req.kvTransferParams;
    if (!this.isConsumer || !p?.do_remote_prefill) return { numExternalTokens: 0, loadAsync: false };
    // The producer's side channel is still handshaking: the request waits, the batch goes on.
    const peer = this.peers?.statusFor(String(p.remote_host), Number(p.remote_port), String(p.remote_engine_id));
    if (peer?.state === 'connecting') return { numExternalTokens: null, loadAsync: false };
    if (this.config.mode === 'read') {
      // Decode loads N-1 tokens and recomputes the last prompt token itself.
      const n = Math.max(req.numPromptTokens - numComputedTokens - 1, 0);
      // Async: the request waits for its READ in WAITING_FOR_REMOTE_KVS (nothing to load: an empty READ releases
      // the producer in the step that admits it); queued while ASYNC_READS_MAX are in flight (a slow producer).
      if (this.config.asyncRead && n > 0 && this.asyncReads.size >= ASYNC_READS_MAX)
        return { numExternalTokens: null, loadAsync: false };
      if (this.config.asyncRead && n > 0) return { numExternalTokens: n, loadAsync: true, readExclusion: true };
      return { numExternalTokens: n, loadAsync: false };
    }
    const n = req.numPromptTokens - numComputedTokens;
    return n > 0 ? { numExternalTokens: n, loadAsync: true } : { numExternalTokens: 0, loadAsync: false };
  }

  /**
   * prefill's tokens per page: from its handshake once known (the authority), else the params' claim,
   * else ours. A claim that contradicts the handshake is refused. A handshake with another engine at that
   * address (the producer restarted, maybe with another block size) is no authority: it is refreshed
   * before the READ, which checks the size again.
   */
  remoteBlockSize(p: KVTransferParams): number {
    const cached = this.peers?.metadataOf(String(p.remote_host), Number(p.remote_port)) ?? null;
    const meta = cached?.engineId === p.remote_engine_id ? cached : null;
    const claimed = p.remote_block_size ?? null;
    const known = meta === null ? null : (meta.layout.blockSizes[this.transferGroupIds[0] ?? 0] ?? null);
    if (known !== null && claimed !== null && known !== claimed)
      throw new HandoffError(
        'BAD_TRANSFER_PARAMS',
        `kv_transfer_params.remote_block_size ${claimed} does not match the producer's handshake (${known} tokens per page)`,
        { param: 'kv_transfer_params.remote_block_size' },
      );
    return known ?? claimed ?? this.blockSize;
  }

  /** Project per-KV-group block ids onto transfer groups (Mamba → its running state page). */
  toTransferGroups(blockIds: number[][]): number[][] {
    return this.transferGroupIds.map((g, i) => {
      const ids = blockIds[g] ?? [];
      return i >= this.numAttnGroups ? ids.slice(-1) : [...ids];
    });
  }

  updateStateAfterAlloc(req: ConnectorRequest, blockIds: number[][], numExternalTokens: number): void {
    const p = req.kvTransferParams;
    if (!this.isConsumer || !p?.do_remote_prefill) return;
    const transferId = p.transfer_id ?? `sidecar-${req.requestId}`;
    const base = {
      requestId: req.requestId,
      transferId,
      remoteEngineId: String(p.remote_engine_id),
      remoteHost: String(p.remote_host),
      remotePort: Number(p.remote_port),
    };
    const local = this.toTransferGroups(blockIds);
    if (this.config.mode === 'write') {
      // The worker keys its WRITE loads by transfer id: a second live load under one id is refused here.
      for (const [other, t] of this.transfers.entries())
        if (t.transferId === transferId && (t.state === 'async-loading' || t.state === 'recv-aborted'))
          // Its finish leaves the live load's transfer alone (Request.leaveSharedTransfer: no release of it).
          throw new HandoffError(
            'BAD_TRANSFER_PARAMS',
            `transfer_id '${transferId.slice(0, 80)}' is already loading here (request ${other.slice(0, 80)})`,
            { param: 'kv_transfer_params.transfer_id' },
          );
      // Only one transfer per request: a resumed (preempted) request recomputes locally.
      p.do_remote_prefill = false;
      if (numExternalTokens > 0) {
        // The producer writes tokens [skip pages, endToken) into our pages (token t into token t), except
        // decode's own (block-aligned) local prefix hit.
        const skip = Math.floor((req.numPromptTokens - numExternalTokens) / this.blockSize);
        const endToken = this.writeEndToken(p, req.numPromptTokens, local[0]?.length ?? 0);
        this.reqsNeedNotify.set(req.requestId, { ...base, localBlockIds: local, skipBlocks: skip, endToken });
        this.transfers.add(req.requestId, { state: 'async-loading', transferId, deadlineMs: Infinity });
      }
      return;
    }
    // A plan that cannot be made throws before the request gives up its transfer: it is then refused and
    // its producer released (releaseUnused), like params refused at admission.
    const remoteBlockSize = this.remoteBlockSize(p);
    const plan = numExternalTokens > 0 ? this.planFor(req, p, local, numExternalTokens, remoteBlockSize) : null;
    // Admission checked the lists in the size known then (ours, before the handshake, without a claim): a
    // list long enough in that size may cover too few tokens in prefill's (the plan would READ in part).
    const remote = defined(remoteBlockIdsPerGroup(p), 'remote_block_ids');
    checkRemoteBlocks(remote, req.numPromptTokens, this.numAttnGroups, remoteBlockSize);
    p.do_remote_prefill = false; // only one transfer per request: a resumed (preempted) request recomputes
    // Nothing to load (full local hit): an empty READ still releases the producer's pages.
    const aligned = plan ?? emptyPlan(local.length);
    this.zeroExcluded.set(req.requestId, this.mutations.zeroExcludedPages(aligned.localBlockIds, local));
    this.stats.readRequests++;
    const grantExpiresMs = p.grant_expires_ms ?? null;
    const ttl = p.grant_ttl_ms;
    const grantLapsesAtMs = typeof ttl === 'number' && req.arrivalMs !== undefined ? req.arrivalMs + ttl : null;
    const async = this.config.asyncRead && plan !== null;
    // Held like a WRITE load until the worker reports it: an abort must not free pages the NIC may still write.
    if (async) this.transfers.add(req.requestId, { state: 'async-loading', transferId, deadlineMs: Infinity });
    if (async) this.asyncReads.add(req.requestId);
    this.reqsNeedRecv.set(req.requestId, {
      ...base,
      ...aligned,
      remoteBlockSize,
      grant: String(p.grant),
      grantExpiresMs,
      grantLapsesAtMs,
      ...(async ? { async: true } : {}),
    });
  }

  /**
   * READ: page lists of decode (every page of the request) and prefill (remote_block_ids), aligned in
   * tokens; decode's recompute tail is dropped and its local prefix hit left out (those pages are shared,
   * cached and already right, so they are never READ destinations).
   */
  private planFor(
    req: ConnectorRequest,
    p: KVTransferParams,
    local: number[][],
    numExternalTokens: number,
    remoteBlockSize: number,
  ): ReadPlan {
    const hit = Math.max(req.numPromptTokens - 1 - numExternalTokens, 0);
    return planRead({
      local,
      remote: defined(remoteBlockIdsPerGroup(p), 'remote_block_ids'),
      numAttnGroups: this.numAttnGroups,
      localBlockSize: this.blockSize,
      remoteBlockSize,
      startToken: Math.floor(hit / this.blockSize) * this.blockSize,
      maxTailBlocks: this.maxDecodeTailBlocks,
      mutations: this.mutations,
    });
  }

  /**
   * WRITE: the tokens the producer's pages hold (it computes the whole prompt), in its block size from the
   * handshake, clipped to our pages.
   */
  private writeEndToken(p: KVTransferParams, numPromptTokens: number, numLocalPages: number): number {
    const meta = this.peers?.metadataOf(String(p.remote_host), Number(p.remote_port)) ?? null;
    const remote = meta?.layout.blockSizes[this.transferGroupIds[0] ?? 0] ?? this.blockSize;
    return Math.min(cdiv(numPromptTokens, remote) * remote, numLocalPages * this.blockSize);
  }

  buildConnectorMeta(_out: Readonly<SchedulerOutput>): OneSidedMetadata {
    const meta = emptyOneSidedMetadata();
    meta.reqsToRecv = [...this.reqsNeedRecv.values()];
    meta.reqsToNotify = [...this.reqsNeedNotify.values()];
    meta.reqsToSave = [...this.reqsNeedSave.values()];
    for (const [requestId, h] of this.transfers.inState('held')) meta.sendTransfers[h.transferId] = requestId;
    meta.expiring = this.expiring;
    this.expiring = {};
    meta.abortedRecvs = this.abortedRecvs;
    this.abortedRecvs = [];
    this.reqsNeedRecv = new Map();
    this.reqsNeedNotify = new Map();
    this.reqsNeedSave = new Map();
    return meta;
  }

  /** The seed's fix (zero_exclusion.ts) on this step's READ destinations; the input list is not changed. */
  excludeReadDestinations(newBlockIdsToZero: number[] | null, meta: OneSidedMetadata | null): number[] | null {
    const lists = (meta?.reqsToRecv ?? []).map((r) => this.zeroExcluded.get(r.requestId) ?? r.localBlockIds);
    this.zeroExcluded.clear();
    const cfg = { readMode: this.config.mode === 'read', hasMamba: this.hasMamba, numAttnGroups: this.numAttnGroups };
    return excludeReadDestinations(
      newBlockIdsToZero === null ? null : [...newBlockIdsToZero],
      this.config.zeroExclusion,
      cfg,
      lists,
    );
  }

  requestFinished(req: ConnectorRequest, blockIds: number[][]): FinishedHandoff {
    const p = req.kvTransferParams;
    if (this.transfers.get(req.requestId)?.state === 'async-loading') {
      // Finished (aborted) while the producer may still be writing into its pages: hold them until the
      // worker knows no WRITE can land any more (sglang #35049, vLLM #32255).
      const loading = this.transfers.delete(req.requestId);
      this.transfers.add(req.requestId, { ...loading, state: 'recv-aborted' });
      this.reqsNeedNotify.delete(req.requestId);
      this.abortedRecvs.push({ requestId: req.requestId, transferId: loading.transferId });
      return { delayFree: true, kvTransferParams: null };
    }
    if (this.releaseUnused(req)) {
      // Finished before its pages were allocated (aborted): the producer's pages are released anyway.
      return { delayFree: false, kvTransferParams: null };
    }
    const stopped = req.status === 'FINISHED_STOPPED' && this.mutations.handoffOnStop; // mutant stop-no-handoff
    const okStatus = req.status === 'FINISHED_LENGTH_CAPPED' || stopped;
    if (!this.isProducer || !p?.do_remote_decode || !okStatus) return { delayFree: false, kvTransferParams: null };
    const transferId = p.transfer_id ?? `xfer-${req.requestId}`;
    const groups = this.toTransferGroups(blockIds);
    const flat = groups.flat();
    const params: Record<string, unknown> = {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_engine_id: this.endpoint.engineId,
      remote_host: this.endpoint.host,
      remote_port: this.endpoint.port,
      remote_block_ids: groups,
      remote_block_size: this.blockSize,
      remote_num_tokens: req.numPromptTokens,
      transfer_id: transferId,
    };
    if (flat.length === 0) return { delayFree: false, kvTransferParams: params };
    this.transfers.add(req.requestId, {
      state: 'held',
      transferId,
      deadlineMs: this.env.nowMs() + this.config.leaseMs,
    });
    if (this.config.mode === 'read') {
      const grant = defined(this.grants, 'grant issuer').issueGrant({
        transferId,
        peerEngineId: null,
        blockIds: this.mutations.grantedPages(groups, req.numPromptTokens, this.blockSize),
        ttlMs: this.config.leaseMs,
      });
      this.stats.grantsIssued++;
      params['grant'] = grant.token;
      // Wall-clock milliseconds, meaningful to another process (the grant itself runs on this engine's clock).
      params['grant_expires_ms'] = Math.round(this.env.wallMs() + (grant.expiresAtMs - this.env.nowMs()));
      // Relative, so decode can judge the lease's end on its own clock when the two wall clocks disagree.
      params['grant_ttl_ms'] = Math.max(0, Math.round(grant.expiresAtMs - this.env.nowMs()));
    } else {
      this.reqsNeedSave.set(req.requestId, { requestId: req.requestId, transferId, localBlockIds: groups });
    }
    return { delayFree: this.mutations.holdPagesUntilRelease, kvTransferParams: params };
  }

  /**
   * A request that will never load (aborted before allocation, or refused at admission after prefill
   * answered): queue an empty READ so the worker sends `release` and prefill frees its pages now rather
   * than at the end of its lease (WRITE too: prefill would wait for a destination that never comes). A
   * READ release carries the request's grant token; a forged one is refused by the producer, so a hostile
   * request cannot free someone else's transfer.
   */
  releaseUnused(req: ConnectorRequest): boolean {
    const p = req.kvTransferParams;
    if (!p?.do_remote_prefill || !this.isConsumer) return false;
    if (!this.mutations.releaseUnusedLoads) return false; // mutant leak-on-cancel
    // WRITE: prefill granted nothing (it holds its pages until told where to write); the release names the transfer.
    const grant = this.config.mode === 'read' ? p.grant : (p.grant ?? '');
    if (!p.remote_engine_id || !p.remote_host || typeof p.remote_port !== 'number' || !p.transfer_id || grant == null)
      return false;
    if (this.config.mode === 'read' && !grant) return false;
    // Apart from live request ids (no X-Request-Id has a space: unused_key.test.ts), and per producer.
    const key = `unused: ${JSON.stringify([p.transfer_id, p.remote_engine_id, p.remote_host, p.remote_port])}`;
    this.reqsNeedRecv.set(key, {
      requestId: key,
      transferId: p.transfer_id,
      ...emptyPlan(this.transferGroupIds.length),
      remoteBlockSize: p.remote_block_size ?? this.blockSize,
      remoteEngineId: p.remote_engine_id,
      remoteHost: p.remote_host,
      remotePort: p.remote_port,
      grant,
    });
    p.do_remote_prefill = false;
    return true;
  }

  updateConnectorOutput(out: KVConnectorOutput): KVConnectorOutput {
    for (const id of [...out.finishedRecving, ...out.failedLoadReqIds])
      if (this.transfers.get(id)?.state === 'async-loading') this.endLoad(id);
    // An aborted WRITE load's report ends its hold whatever this side's role (kv_both is both).
    const abortedDone = new Set(out.finishedSending.filter((id) => this.transfers.get(id)?.state === 'recv-aborted'));
    for (const id of abortedDone) this.endLoad(id);
    if (!this.isProducer) return out;
    const finishedSending = out.finishedSending.filter((id) => {
      if (abortedDone.has(id)) return true;
      const state = this.transfers.get(id)?.state;
      return (state === 'held' || state === 'expiring') && this.transfers.delete(id);
    });
    const now = this.env.nowMs();
    for (const [requestId, h] of this.transfers.inState('held')) {
      if (h.deadlineMs > now) continue;
      this.endLease(requestId, h);
      this.stats.leasesExpired++;
    }
    return { ...emptyConnectorOutput(), ...out, finishedSending };
  }

  /** A load (or an aborted one) was reported: the worker holds no READ of it any more. */
  private endLoad(id: string): void {
    this.transfers.delete(id);
    this.asyncReads.delete(id);
  }

  /**
   * A held transfer's lease ends (run out, or endHold): no new READ of the pages (the grant dies now), but
   * the NIC may still be sending a reply from them, or the worker pushing them (it learns of this in the
   * next metadata): they are freed once the worker reports them (Producer.expire, WriteProducer.expire).
   */
  private endLease(requestId: string, h: SideTransfer): void {
    this.grants?.revokeGrant(h.transferId);
    this.transfers.drop(requestId);
    this.transfers.add(requestId, { ...h, state: 'expiring' });
    this.expiring[h.transferId] = requestId;
  }

  hasPendingWork(): boolean {
    return (
      this.transfers.size > 0 ||
      this.reqsNeedRecv.size > 0 ||
      this.reqsNeedNotify.size > 0 ||
      this.reqsNeedSave.size > 0 ||
      Object.keys(this.expiring).length > 0 ||
      this.abortedRecvs.length > 0
    );
  }

  endHold(requestId: string): boolean {
    const h = this.transfers.get(requestId);
    if (h?.state !== 'held') return false;
    this.endLease(requestId, h);
    this.stats.holdsEnded++;
    return true;
  }

  get numHeld(): number {
    return this.transfers.inState('held').length;
  }
}
