/**
 * The P/D proxy's flow inside the simulated world (what src/serve's proxy does over HTTP):
 *   READ:  prefill with max_tokens 1 + do_remote_decode, then decode with the params prefill returned;
 *   WRITE: both at once; decode names the prefill engine, prefill pushes when its forward is done.
 * Each request ends exactly once: success (tokens + logits hashes), or a typed failure. A prefill
 * that died fails the requests it held with PEER_UNAVAILABLE, like a dropped connection.
 */
import { rethrowIfAssertion } from '../util/assert.ts';
import { HandoffError, isHandoffError } from '../util/errors.ts';
import type { EngineOutput } from '../engine/output.ts';
import type { SamplingParamsData } from '../worker/scheduler_output.ts';
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
}

function failure(code: string | null, message: string, finishReason = 'error'): RequestOutcome {
  return { ok: false, tokenIds: [], logitsHashes: [], nanLogits: false, finishReason, errorCode: code, errorMessage: message, numExternalTokens: 0 };
}

export class SimProxy {
  readonly requests: ProxyRequest[];

  constructor(
    specs: readonly SimRequestSpec[],
    private readonly prefill: SimInstance,
    private readonly decode: SimInstance,
    private readonly mode: 'read' | 'write',
    private readonly nowMs: () => number,
    private readonly onEvent: (r: ProxyRequest, what: string) => void,
  ) {
    this.requests = specs.map((spec) => ({ spec, transferId: `xfer-${spec.index}`, phase: 'pending', outcome: null, startMs: null, endMs: null }));
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

  /** The request arrives at the proxy. */
  arrive(r: ProxyRequest): void {
    r.startMs = this.nowMs();
    this.onEvent(r, 'arrive');
    if (!this.prefill.alive) return this.finish(r, failure('PEER_UNAVAILABLE', 'prefill instance is down'));
    r.phase = 'prefill';
    const prefillParams = { do_remote_decode: true, do_remote_prefill: false, transfer_id: r.transferId };
    this.submit(this.prefill, r, this.prefillId(r), { ...r.spec.sampling, maxTokens: 1 }, prefillParams, (out) => {
      if (this.mode === 'write') return; // decode's result is the answer
      if (!out.ok) return this.finish(r, out);
      r.phase = 'decode';
      this.onEvent(r, 'decode');
      const params = this.lastParams.get(r.spec.index) ?? {};
      this.submit(this.decode, r, this.decodeId(r), r.spec.sampling, params, (res) => this.finish(r, res));
    });
    if (this.mode === 'write' && r.phase === 'prefill') {
      r.phase = 'decode';
      const addr = this.prefill.transfer.address();
      const params = { do_remote_prefill: true, remote_engine_id: this.prefill.engineId, remote_host: addr.host, remote_port: addr.port, transfer_id: r.transferId };
      this.submit(this.decode, r, this.decodeId(r), r.spec.sampling, params, (res) => this.finish(r, res));
    }
  }

  private readonly lastParams = new Map<number, Record<string, unknown>>();

  private submit(
    inst: SimInstance,
    r: ProxyRequest,
    requestId: string,
    sampling: SimRequestSpec['sampling'],
    params: Record<string, unknown>,
    done: (o: RequestOutcome) => void,
  ): void {
    const tokens: number[] = [];
    const hashes: Array<string | null> = [];
    let nan = false;
    try {
      inst.engine.submit({ requestId, promptTokenIds: r.spec.promptTokenIds, sampling, kvTransferParams: params }, (o: EngineOutput) => {
        tokens.push(...o.newTokenIds);
        hashes.push(...o.logitsHashes);
        nan ||= o.nanLogits;
        if (o.finishReason === null) return;
        if (o.kvTransferParams) this.lastParams.set(r.spec.index, o.kvTransferParams);
        if (o.finishReason === 'abort') return done(failure('REQUEST_ABORTED', `${requestId} aborted`, 'abort'));
        if (o.finishReason === 'error') {
          const e = o.error;
          return done(failure(isHandoffError(e) ? e.code : null, e ? e.message : `${requestId} failed without an error`));
        }
        done({ ok: true, tokenIds: tokens, logitsHashes: hashes, nanLogits: nan, finishReason: o.finishReason, errorCode: null, errorMessage: null, numExternalTokens: o.numExternalTokens });
      });
    } catch (e) {
      rethrowIfAssertion(e);
      done(failure(isHandoffError(e) ? e.code : null, String(e)));
    }
  }

  private finish(r: ProxyRequest, outcome: RequestOutcome): void {
    if (r.phase === 'done') return;
    r.phase = 'done';
    r.outcome = outcome;
    r.endMs = this.nowMs();
    this.onEvent(r, outcome.ok ? 'done' : `failed ${outcome.errorCode ?? 'untyped'}`);
  }

  /** The client gave up: abort wherever the request is now. */
  abort(r: ProxyRequest): void {
    if (r.phase === 'prefill' && this.prefill.alive) this.prefill.engine.abort(this.prefillId(r));
    if (r.phase === 'decode') this.decode.engine.abort(this.decodeId(r));
    if (r.phase === 'decode' && this.mode === 'write' && this.prefill.alive) this.prefill.engine.abort(this.prefillId(r));
    if (r.phase === 'pending') this.finish(r, failure('REQUEST_ABORTED', 'aborted before it arrived', 'abort'));
  }

  /** The prefill instance died: requests waiting on it fail like a dropped connection. */
  prefillDied(): void {
    const err = new HandoffError('PEER_UNAVAILABLE', 'prefill instance died');
    for (const r of this.requests) if (r.phase === 'prefill') this.finish(r, failure(err.code, err.message));
  }
}
