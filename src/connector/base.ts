/**
 * The KV connector contract, split like vLLM's KVConnectorBase_V1: a scheduler side (decides what is
 * loaded, builds per-step metadata, owns hand-off of pages at finish) and a worker side (moves bytes;
 * implements the runner's hook interface in src/worker/hooks.ts).
 *
 * Ownership: a page belongs to the scheduler's KVCacheManager. `requestFinished` may answer
 * `delayFree: true`, which lends the request's pages to the connector until the request id comes back
 * in some step's `finishedSending`; only then are they freed.
 */
import type { KVConnectorMetadata } from '../worker/connector_metadata.ts';
import type { KVConnectorOutput, SchedulerOutput } from '../worker/scheduler_output.ts';
import type { KVTransferParams } from './params.ts';

/** What the connector may read (and, for `kvTransferParams`, update) of a request. */
export interface ConnectorRequest {
  readonly requestId: string;
  readonly numPromptTokens: number;
  readonly numTokens: number;
  readonly status: string;
  /** When this instance received the request (env.nowMs()); absent for requests built outside the engine. */
  readonly arrivalMs?: number;
  kvTransferParams: KVTransferParams | null;
}

export interface MatchedTokens {
  /** Tokens beyond the local hit that the connector will provide; null = ask again next step. */
  numExternalTokens: number | null;
  /** True: the load is asynchronous (request waits in WAITING_FOR_REMOTE_KVS). */
  loadAsync: boolean;
  /**
   * An async READ: its destinations leave the zero list by the connector's exclusion (the seed's fix and
   * its variants, excludeReadDestinations), as a synchronous READ's do; the scheduler does not take them
   * out itself, as it does for a WRITE load.
   */
  readExclusion?: boolean;
}

export interface FinishedHandoff {
  delayFree: boolean;
  kvTransferParams: Record<string, unknown> | null;
}

/**
 * vLLM's scheduler-side methods in camelCase (get_num_new_matched_tokens, update_state_after_alloc,
 * build_connector_meta, request_finished, update_connector_output), plus the three request hooks the
 * engine calls before admission and the zeroing exclusion as its own step. Every method is required;
 * NullConnector holds the defaults.
 */
export interface ConnectorScheduler {
  readonly name: string;
  /** The prompt this instance computes for a request (a hybrid producer computes N-1 tokens). */
  prefillPromptTokens(promptTokenIds: readonly number[], params: KVTransferParams | null): number[];
  /** The tokens this instance samples for a request (a producer's prefill half: one, whatever was asked). */
  prefillMaxTokens(maxTokens: number, params: KVTransferParams | null): number;
  /** Check a request's transfer params before admission; throws a HandoffError, allocates nothing. */
  validateRequest(req: ConnectorRequest): void;
  /** A request refused or finished before it could load: give the producer its pages back; true if queued. */
  releaseUnused(req: ConnectorRequest): boolean;
  getNumNewMatchedTokens(req: ConnectorRequest, numComputedTokens: number): MatchedTokens;
  /** Called after allocateSlots with every page of the request, per group. */
  updateStateAfterAlloc(req: ConnectorRequest, blockIds: number[][], numExternalTokens: number): void;
  /** Called once per schedule(), after `newBlockIdsToZero` is final: this step's metadata (resets per-step state). */
  buildConnectorMeta(out: Readonly<SchedulerOutput>): KVConnectorMetadata | null;
  /**
   * The seed's fix, as its own step of schedule(): the zeroing list without the pages this step's
   * metadata READs into (per `zeroExclusion`). Returns a new list; never changes the input.
   */
  excludeReadDestinations(newBlockIdsToZero: number[] | null, meta: KVConnectorMetadata | null): number[] | null;
  /** The request finished; blockIds are its pages per group. */
  requestFinished(req: ConnectorRequest, blockIds: number[][]): FinishedHandoff;
  /** Runs every step before finished-sending pages are freed; may rewrite `finishedSending`. */
  updateConnectorOutput(out: KVConnectorOutput): KVConnectorOutput;
  /** True while the connector holds pages or waits for peers, so an idle engine keeps stepping. */
  hasPendingWork(): boolean;
  /**
   * Producer: the finished request's answer (its kv_transfer_params) never reached its client, so no
   * consumer will read or be pushed these pages: end its lease now (revoke, drain, free, as at expiry).
   * True if a hold was ended.
   */
  endHold(requestId: string): boolean;
}

/** Colocated serving: nothing is loaded, nothing is held. */
export class NullConnector implements ConnectorScheduler {
  readonly name = 'null';
  prefillPromptTokens(promptTokenIds: readonly number[]): number[] {
    return [...promptTokenIds];
  }
  prefillMaxTokens(maxTokens: number): number {
    return maxTokens;
  }
  validateRequest(): void {}
  releaseUnused(): boolean {
    return false;
  }
  getNumNewMatchedTokens(): MatchedTokens {
    return { numExternalTokens: 0, loadAsync: false };
  }
  updateStateAfterAlloc(): void {}
  buildConnectorMeta(_out: Readonly<SchedulerOutput>): KVConnectorMetadata | null {
    return null;
  }
  excludeReadDestinations(newBlockIdsToZero: number[] | null): number[] | null {
    return newBlockIdsToZero;
  }
  requestFinished(): FinishedHandoff {
    return { delayFree: false, kvTransferParams: null };
  }
  updateConnectorOutput(out: KVConnectorOutput): KVConnectorOutput {
    return out;
  }
  hasPendingWork(): boolean {
    return false;
  }
  endHold(): boolean {
    return false;
  }
}
