/**
 * The P/D proxy inside the simulated world: the same pdFlow (serve/pd_flow.ts) as the HTTP proxy, with
 * legs that submit to the simulated engines instead of POSTing:
 *   READ:  prefill with max_tokens 1 + do_remote_decode, then decode with the params prefill returned;
 *   WRITE: both at once; decode names the prefill engine, prefill pushes when its forward is done.
 * Each request ends exactly once: success (tokens + logits hashes), or a typed failure. A prefill
 * that died fails the requests it held with PEER_UNAVAILABLE, like a dropped connection. With a
 * `route` (the xpyd world's KV-aware router) each request goes to the instances it names; no prefill
 * means decode computes the prompt itself (no kv_transfer_params), like the HTTP proxy's decode-only path.
 */
import { AssertionFailure, rethrowIfAssertion } from '../util/assert.ts';
import { HandoffError, isHandoffError } from '../util/errors.ts';
import type { EngineOutput } from '../engine/output.ts';
import type { SamplingParamsData } from '../worker/scheduler_output.ts';
import { pdFlow, type PdLegs } from '../serve/pd_flow.ts';
import type { SimInstance } from './instance.ts';

export interface SimRequestSpec {
  index: number;
  promptTokenIds: number[];
  sampling: Partial<SamplingParamsData> & { maxTokens: number };
  arrivalMs: number;
}

export type RequestPhase = 'pending' | 'prefill' | 'decode' | 'done';

export interface RequestOutcome {
  ok: boolean;
  tokenIds: number[];
  logitsHashes: Array<string | null>;
  nanLogits: boolean;
  finishReason: string;
  /** Failure: the error code, or null when the error was not a HandoffError (an untyped failure). */
  errorCode: string | null;
  errorMessage: string | null;
  numExternalTokens: number;
}

export interface ProxyRequest {
  spec: SimRequestSpec;
  transferId: string;
  phase: RequestPhase;
  outcome: RequestOutcome | null;
  startMs: number | null;
  endMs: number | null;
  /** Prefill finished and returned these params at this time (READ: it now holds its pages for decode). */
  prefillAnswer: { params: Record<string, unknown> | null; atMs: number } | null;
  /** Where it was routed (null before it arrived; prefill null: decode-only). */
  route: SimRoute | null;
}

export interface SimRoute {
  prefill: SimInstance | null;
  decode: SimInstance;
}

function failure(code: string | null, message: string, finishReason = 'error'): RequestOutcome {
  return {
    ok: false,
    tokenIds: [],
    logitsHashes: [],
    nanLogits: false,
    finishReason,
    errorCode: code,
    errorMessage: message,
    numExternalTokens: 0,
  };
}

export class SimProxy {
  readonly requests: ProxyRequest[];
  /**
   * Called before the proxy acts on an instance's engine (submit, abort, cancel, release): the step that
   * runs it writes that instance's host state (DPOR's footprint, dpor_world.ts).
   */
  touches: ((inst: SimInstance) => void) | null = null;

  constructor(
    specs: readonly SimRequestSpec[],
    private readonly prefill: SimInstance,
    private readonly decode: SimInstance,
    private readonly mode: 'read' | 'write',
    private readonly nowMs: () => number,
    private readonly onEvent: (r: ProxyRequest, what: string) => void,
    /** Set: prefill's answer travels back to the proxy as a world choice (`deliver` when it arrives). */
    private readonly answerHop: ((r: ProxyRequest, deliver: () => void) => void) | null = null,
    /** Set: where each request goes (default: the one prefill and the one decode). */
    private readonly router: ((r: ProxyRequest) => SimRoute) | null = null,
  ) {
    this.requests = specs.map((spec) => ({
      spec,
      transferId: `xfer-${spec.index}`,
      phase: 'pending',
      outcome: null,
      startMs: null,
      endMs: null,
      prefillAnswer: null,
      route: null,
    }));
  }

  prefillId(r: ProxyRequest): string {
    return `p-${r.spec.index}`;
  }
  decodeId(r: ProxyRequest): string {
    return `d-${r.spec.index}`;
  }

  get allDone(): boolean {
    return this.requests.every((r) => r.phase === 'done');
  }

  /** The request arrives at the proxy and goes through pdFlow, the HTTP proxy's flow, with two engine legs. */
  arrive(r: ProxyRequest): void {
    if (r.phase === 'done') return; // its client went away before it arrived
    r.startMs = this.nowMs();
    this.onEvent(r, 'arrive');
    const route = this.router?.(r) ?? { prefill: this.prefill, decode: this.decode };
    r.route = route;
    if (route.prefill === null) return this.decodeOnly(r, route.decode);
    const prefill = route.prefill;
    const decode = route.decode;
    if (!prefill.alive) return this.finish(r, failure('PEER_UNAVAILABLE', 'prefill instance is down'));
    r.phase = 'prefill';
    const client = new AbortController();
    this.clients.set(r.spec.index, client);
    const addr = prefill.transfer.address();
    const identity = {
      engineId: prefill.engineId,
      sideChannelHost: addr.host,
      sideChannelPort: addr.port,
      transferMode: prefill.spec.connector.mode,
    };
    const legs: PdLegs<RequestOutcome> = {
      prefill: (ask, signal) =>
        this.leg(
          prefill,
          r,
          this.prefillId(r),
          { ...r.spec.sampling, maxTokens: ask.maxTokens },
          ask.kvTransferParams,
          signal,
        ),
      decode: (params, signal) => {
        r.phase = 'decode';
        if (this.mode === 'read') this.onEvent(r, 'decode');
        return this.leg(decode, r, this.decodeId(r), r.spec.sampling, params, signal).then((o) => o.outcome);
      },
      // What the HTTP proxy's POST /handoff/release does on the decode instance.
      releaseUnused: (params) => {
        this.onEvent(r, 'release unused');
        if (!decode.alive) return;
        this.touches?.(decode);
        decode.engine.releaseUnused(params);
      },
    };
    this.settled(
      r,
      pdFlow(legs, { mode: this.mode, transferId: r.transferId, prefill: identity, signal: client.signal }),
    );
  }

  /** Decode holds the prefix: it computes the prompt itself, no remote prefill, no transfer. */
  private decodeOnly(r: ProxyRequest, decode: SimInstance): void {
    if (!decode.alive) return this.finish(r, failure('PEER_UNAVAILABLE', 'decode instance is down'));
    r.phase = 'decode';
    this.onEvent(r, 'decode-only');
    const client = new AbortController();
    this.clients.set(r.spec.index, client);
    const run = this.leg(decode, r, this.decodeId(r), r.spec.sampling, null, client.signal).then((o) => o.outcome);
    this.settled(r, run);
  }

  /** The request ends with `flow`'s outcome, or its typed failure. */
  private settled(r: ProxyRequest, flow: Promise<RequestOutcome>): void {
    flow.then(
      (outcome) => this.finish(r, outcome),
      (e: unknown) => {
        this.clients.delete(r.spec.index);
        // An assertion is a crash of the run (the world reports it), never a request's failure.
        if (e instanceof AssertionFailure) return void (this.crashed ??= e);
        this.finish(
          r,
          e instanceof LegFailure
            ? e.outcome
            : failure(isHandoffError(e) ? e.code : null, e instanceof Error ? e.message : String(e)),
        );
      },
    );
  }

  /** An assertion that failed inside a request's flow (the world turns it into a 'crash' violation). */
  crashed: AssertionFailure | null = null;
  private readonly clients = new Map<number, AbortController>();
  /** Legs in flight (either side): an instance that dies fails them like a dropped connection. */
  private readonly legs = new Map<string, { inst: SimInstance; fail: (e: LegFailure) => void }>();

  /** One side of the flow: submit to `inst`; resolves on success, rejects with the failure's outcome. */
  private leg(
    inst: SimInstance,
    r: ProxyRequest,
    requestId: string,
    sampling: SimRequestSpec['sampling'],
    params: Record<string, unknown> | null,
    signal: AbortSignal,
  ): Promise<{ outcome: RequestOutcome; kvTransferParams: Record<string, unknown> | null }> {
    let pending = true;
    let resolve!: (v: { outcome: RequestOutcome; kvTransferParams: Record<string, unknown> | null }) => void;
    let reject!: (e: LegFailure) => void;
    const p = new Promise<{ outcome: RequestOutcome; kvTransferParams: Record<string, unknown> | null }>(
      (res, rej) => ((resolve = res), (reject = rej)),
    );
    const settle = (outcome: RequestOutcome, kvTransferParams: Record<string, unknown> | null): void => {
      if (!pending) return;
      pending = false;
      this.legs.delete(requestId);
      if (!outcome.ok) return reject(new LegFailure(outcome));
      const isPrefill = inst.spec.role === 'producer';
      if (isPrefill) r.prefillAnswer = { params: kvTransferParams, atMs: this.nowMs() };
      if (isPrefill && this.answerHop !== null) return this.answerHop(r, () => resolve({ outcome, kvTransferParams }));
      resolve({ outcome, kvTransferParams });
    };
    // Sent to an instance that died after routing chose it (an xpyd restart): the connection is refused.
    if (!inst.alive) {
      settle(failure('PEER_UNAVAILABLE', `${inst.name} is down`), null);
      return p;
    }
    this.legs.set(requestId, { inst, fail: (e) => settle(e.outcome, null) });
    // As the HTTP proxy does: a READ prefill leg is cancelled in band (its answer, if it finished, still
    // comes and is released through decode); any other leg is aborted (an answer never sent ends its hold).
    const inBand = this.mode === 'read' && inst.spec.role === 'producer';
    signal.addEventListener(
      'abort',
      () => {
        if (!pending || !inst.alive) return;
        this.touches?.(inst);
        if (inBand) inst.engine.cancel(requestId);
        else inst.engine.abort(requestId);
      },
      { once: true },
    );
    // Submitted synchronously (an assertion here throws out of arrive, as the world expects).
    this.submit(inst, r, requestId, sampling, params, settle);
    return p;
  }

  private submit(
    inst: SimInstance,
    r: ProxyRequest,
    requestId: string,
    sampling: SimRequestSpec['sampling'],
    params: Record<string, unknown> | null,
    done: (o: RequestOutcome, kvTransferParams: Record<string, unknown> | null) => void,
  ): void {
    const tokens: number[] = [];
    const hashes: Array<string | null> = [];
    let nan = false;
    this.touches?.(inst);
    try {
      inst.engine.submit(
        { requestId, promptTokenIds: r.spec.promptTokenIds, sampling, kvTransferParams: params },
        (o: EngineOutput) => {
          tokens.push(...o.newTokenIds);
          hashes.push(...o.logitsHashes);
          nan ||= o.nanLogits;
          if (o.finishReason === null) return;
          if (o.finishReason === 'abort')
            return done(failure('REQUEST_ABORTED', `${requestId} aborted`, 'abort'), null);
          if (o.finishReason === 'error') {
            const e = o.error;
            return done(
              failure(isHandoffError(e) ? e.code : null, e ? e.message : `${requestId} failed without an error`),
              null,
            );
          }
          const ok = {
            ok: true,
            tokenIds: tokens,
            logitsHashes: hashes,
            nanLogits: nan,
            finishReason: o.finishReason,
            errorCode: null,
            errorMessage: null,
            numExternalTokens: o.numExternalTokens,
          };
          done(ok, o.kvTransferParams);
        },
      );
    } catch (e) {
      rethrowIfAssertion(e);
      done(failure(isHandoffError(e) ? e.code : null, String(e)), null);
    }
  }

  private finish(r: ProxyRequest, outcome: RequestOutcome): void {
    if (r.phase === 'done') return;
    this.clients.delete(r.spec.index);
    r.phase = 'done';
    r.outcome = outcome;
    r.endMs = this.nowMs();
    this.onEvent(r, outcome.ok ? 'done' : `failed ${outcome.errorCode ?? 'untyped'}`);
  }

  /** The client gave up: pdFlow aborts wherever the request is now. */
  abort(r: ProxyRequest): void {
    if (r.phase === 'pending') return this.finish(r, failure('REQUEST_ABORTED', 'aborted before it arrived', 'abort'));
    this.clients.get(r.spec.index)?.abort();
  }

  /** An instance died (a prefill's death, a decode's restart): its requests fail like a dropped connection. */
  instanceDied(dead: SimInstance): void {
    const err = new HandoffError(
      'PEER_UNAVAILABLE',
      `${dead.spec.role === 'producer' ? 'prefill' : 'decode'} instance died`,
    );
    for (const leg of [...this.legs.values()])
      if (leg.inst === dead) leg.fail(new LegFailure(failure(err.code, err.message)));
  }
}

/** A leg that ended without success; its outcome is the request's (typed or untyped) failure. */
class LegFailure extends Error {
  constructor(readonly outcome: RequestOutcome) {
    super(outcome.errorMessage ?? 'failed');
  }
}
