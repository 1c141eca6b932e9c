/**
 * pdFlow: the prefill → kv_transfer_params → decode flow, written once (plain logic, no I/O). The HTTP
 * proxy (proxy.ts), the simulator's proxy (sim/proxy.ts) and the in-process pair (sim/pd_pair.ts) give
 * it two legs that run one side each; it decides what each side is asked, in which order, and which
 * error is the answer. Field names are vLLM's (reference spec §6.2):
 *
 *   READ   prefill: max_tokens 1, {do_remote_decode: true, do_remote_prefill: false, transfer_id}
 *            └─> its kv_transfer_params (none: TRANSFER_FAILED)
 *          decode:  those params with do_remote_prefill: true, do_remote_decode: false
 *   WRITE  prefill (as above) and decode at once, one transfer_id; decode names prefill's engine and side
 *          channel so it can tell prefill where to write (unknown: PEER_UNAVAILABLE; a prefill not in
 *          WRITE mode: PEER_INCOMPATIBLE).
 *
 * Errors: a leg's failure is the answer as it is. READ: prefill's error, else decode's. WRITE: a
 * prefill failure aborts decode (it would wait for KV that never comes) and is the answer; a decode
 * failure aborts prefill (its pages are not needed) and is the answer. The client going away
 * (`signal`) aborts the running legs; the answer is then REQUEST_ABORTED (or the leg's own error). READ:
 * when it goes away after prefill answered, decode is asked to release prefill's held pages.
 */
import { rethrowIfAssertion } from '../util/assert.ts';
import { HandoffError } from '../util/errors.ts';

export type PdMode = 'read' | 'write';
export type TransferParams = Record<string, unknown>;

/** Prefill's identity as decode needs it in WRITE mode (its /handoff/info, or the engine itself). */
export interface PrefillIdentity {
  engineId: string | null;
  sideChannelHost: string | null;
  sideChannelPort: number | null;
  /** The prefill instance's transfer mode (null: not published). */
  transferMode: string | null;
}

/** What prefill is asked: compute the prompt, sample one token, hold the KV for decode. */
export interface PrefillAsk {
  maxTokens: 1;
  kvTransferParams: TransferParams;
}

export interface PdLegs<R> {
  /**
   * Run prefill; resolves with what it returned (`kvTransferParams` as found in its answer), rejects with its error.
   */
  prefill(ask: PrefillAsk, signal: AbortSignal): Promise<{ kvTransferParams: unknown }>;
  /** Run decode with these params; resolves with the flow's answer, rejects with its error. */
  decode(kvTransferParams: TransferParams, signal: AbortSignal): Promise<R>;
  /**
   * READ: the client went away after prefill answered, so decode will never ask for these pages: have
   * decode send prefill its release now (best effort, never awaited; the producer's lease is the fallback).
   */
  releaseUnused?(kvTransferParams: TransferParams): void;
}

export interface PdFlowOptions {
  mode: PdMode;
  transferId: string;
  /** WRITE only: who decode waits for. */
  prefill?: PrefillIdentity | null;
  /** The client went away. */
  signal?: AbortSignal;
}

export function prefillAsk(transferId: string): PrefillAsk {
  return {
    maxTokens: 1,
    kvTransferParams: { do_remote_decode: true, do_remote_prefill: false, transfer_id: transferId },
  };
}

/** READ: decode loads what prefill computed; the params come back from prefill unchanged but for the flags. */
export function decodeParamsRead(prefillParams: unknown): TransferParams {
  if (prefillParams === null || typeof prefillParams !== 'object' || Array.isArray(prefillParams)) {
    throw new HandoffError('TRANSFER_FAILED', 'prefill answered without kv_transfer_params');
  }
  return { ...(prefillParams as TransferParams), do_remote_prefill: true, do_remote_decode: false };
}

export function decodeParamsWrite(prefill: PrefillIdentity | null, transferId: string): TransferParams {
  if (prefill?.engineId == null || prefill.sideChannelHost == null || prefill.sideChannelPort == null) {
    throw new HandoffError(
      'PEER_UNAVAILABLE',
      'the prefill instance has not published its engine id and side channel (/handoff/info)',
    );
  }
  if (prefill.transferMode !== 'write') {
    throw new HandoffError(
      'PEER_INCOMPATIBLE',
      `the prefill instance runs in ${String(prefill.transferMode)} mode; the proxy is in WRITE mode`,
    );
  }
  return {
    do_remote_prefill: true,
    do_remote_decode: false,
    remote_engine_id: prefill.engineId,
    remote_host: prefill.sideChannelHost,
    remote_port: prefill.sideChannelPort,
    transfer_id: transferId,
  };
}

const aborted = (): HandoffError => new HandoffError('REQUEST_ABORTED', 'the client went away');

/** One signal per leg, aborted with the client's. */
function legSignal(client: AbortSignal | undefined): AbortController {
  const c = new AbortController();
  if (client?.aborted) c.abort();
  else client?.addEventListener('abort', () => c.abort(), { once: true });
  return c;
}

/**
 * Run one request through prefill and decode. The legs are called synchronously where the flow starts
 * them (READ: prefill at once; WRITE: prefill, then decode, at once), so a deterministic caller sees
 * them submitted in that order before anything else runs; a leg that throws there (rather than
 * rejecting) throws out of pdFlow.
 */
export function pdFlow<R>(legs: PdLegs<R>, opts: PdFlowOptions): Promise<R> {
  if (opts.signal?.aborted) return Promise.reject(aborted());
  return opts.mode === 'read' ? readFlow(legs, opts) : writeFlow(legs, opts);
}

function readFlow<R>(legs: PdLegs<R>, opts: PdFlowOptions): Promise<R> {
  const pre = legs.prefill(prefillAsk(opts.transferId), legSignal(opts.signal).signal);
  return (async () => {
    const answer = await pre;
    if (opts.signal?.aborted) {
      // Prefill holds its pages for a decode request that will never come (dynamo #13855, vLLM #50425).
      const held = answer.kvTransferParams;
      if (typeof held === 'object' && held !== null && !Array.isArray(held))
        legs.releaseUnused?.(decodeParamsRead(held));
      throw aborted();
    }
    return legs.decode(decodeParamsRead(answer.kvTransferParams), legSignal(opts.signal).signal);
  })();
}

function writeFlow<R>(legs: PdLegs<R>, opts: PdFlowOptions): Promise<R> {
  let decodeParams: TransferParams;
  try {
    decodeParams = decodeParamsWrite(opts.prefill ?? null, opts.transferId);
  } catch (e) {
    rethrowIfAssertion(e);
    return Promise.reject(e as Error);
  }
  const pAbort = legSignal(opts.signal);
  const dAbort = legSignal(opts.signal);
  const failed: { prefill: unknown } = { prefill: null };
  const pre = legs.prefill(prefillAsk(opts.transferId), pAbort.signal).then(
    () => undefined,
    (e: unknown) => {
      rethrowIfAssertion(e);
      if (pAbort.signal.aborted) return;
      failed.prefill = e;
      dAbort.abort();
    },
  );
  const dec = legs.decode(decodeParams, dAbort.signal);
  return (async () => {
    try {
      const result = await dec;
      await pre;
      return result;
    } catch (e) {
      rethrowIfAssertion(e);
      if (failed.prefill === null) pAbort.abort();
      await pre;
      throw opts.signal?.aborted ? e : (failed.prefill ?? e);
    }
  })();
}
