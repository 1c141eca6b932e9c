/**
 * Generation: one API request driven through the engine. Engine outputs (one token each) become text
 * with the incremental detokenizer, pass the stop-string checker, and reach a sink as pieces and one
 * final event (finish or error). A stop string aborts the engine request at once, so its pages are
 * freed; `cancel()` (client gone) does the same and reports nothing.
 *
 * Prefill requests of a P/D pair (`do_remote_decode`) only compute the KV: stop strings do not apply,
 * so the request always reaches the connector's requestFinished and returns kv_transfer_params.
 */
import { assert } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { decode, EOS_TOKEN_ID, IncrementalDecoder } from '../model/tokenizer.ts';
import type { EngineOutput } from '../engine/output.ts';
import type { GenerateRequest } from '../engine/llm_engine.ts';
import type { ApiRequest } from './openai_request.ts';
import { emptyPiece, usageOf, type ApiFinishReason, type Piece, type Usage } from './openai_response.ts';
import { StopChecker } from './stop_checker.ts';

export interface GenerationSink {
  onPiece(p: Piece): void;
  onFinish(f: {
    piece: Piece;
    finishReason: ApiFinishReason;
    /** vLLM's stop_reason: the stop string or stop token id that ended the answer; null for EOS or length. */
    stopReason: string | number | null;
    kvTransferParams: Record<string, unknown> | null;
    usage: Usage;
  }): void;
  onError(e: HandoffError): void;
}

/** Latency hooks (metrics); milliseconds. */
export interface GenerationObserver {
  firstToken(ttftMs: number): void;
  interToken(itlMs: number): void;
  finished(reason: 'stop' | 'length' | 'abort' | 'error', promptTokens: number, completionTokens: number): void;
  /** A request that computed its own prompt finished: its prompt tokens, and those its prefix cache held. */
  prefixCache?(promptTokens: number, cachedTokens: number): void;
}

/** What a generation needs of the engine (LLMEngine satisfies it). */
export interface EngineHandle {
  /** Returns the engine's request (abort's `only`). */
  submit(g: GenerateRequest, onOutput: (o: EngineOutput) => void): object;
  /** `only`: abort that request only (not another one reusing its id); its finished hold still ends. */
  abort(requestId: string, only?: object): void;
  cancel(requestId: string): void;
}

export class Generation {
  private readonly decoder = new IncrementalDecoder();
  private readonly stops: StopChecker;
  private readonly startMs: number;
  private lastTokenMs: number | null = null;
  private completionTokens = 0;
  private charsSoFar = 0;
  private cachedTokens = 0;
  private finished = false;
  private cancelled = false;
  /** The engine's request, once submitted (a later request may reuse the id). */
  private submitted: object | null = null;

  constructor(
    private readonly engine: EngineHandle,
    readonly api: ApiRequest,
    readonly requestId: string,
    private readonly seed: number,
    private readonly env: Env,
    private readonly sink: GenerationSink,
    private readonly observer: GenerationObserver | null = null,
  ) {
    const isPrefillHalf = api.kvTransferParams?.do_remote_decode === true;
    this.stops = new StopChecker(isPrefillHalf ? [] : api.stop, api.includeStopStr);
    this.startMs = env.nowMs();
  }

  get done(): boolean {
    return this.finished;
  }

  /** Submit to the engine; throws HandoffError (nothing allocated) when the engine refuses the request. */
  start(): void {
    const a = this.api;
    this.submitted = this.engine.submit(
      {
        requestId: this.requestId,
        promptTokenIds: a.promptTokenIds,
        sampling: {
          maxTokens: a.maxTokens,
          temperature: a.temperature,
          ...(a.topP !== undefined ? { topP: a.topP } : {}),
          ...(a.topK !== undefined ? { topK: a.topK } : {}),
          seed: this.seed,
          stopTokenIds: a.stopTokenIds,
          ignoreEos: a.ignoreEos,
        },
        kvTransferParams: a.kvTransferParams,
      },
      (o) => this.onOutput(o),
    );
  }

  /**
   * Cancelled in band (/handoff/cancel): the request is aborted if it still runs, and its client, still
   * connected, gets the abort as its answer; a request already finished answers as usual. True if it ran.
   */
  cancelInBand(): boolean {
    if (this.finished) return false;
    this.engine.cancel(this.requestId);
    return true;
  }

  /**
   * The answer was written but never reached the client: pages the engine still holds for a peer
   * (a prefill's, for decode) are freed now (EngineCore.abort of a finished request ends its hold). A
   * retry that reuses the id while this answer hangs is another request: it is left to run.
   */
  undelivered(): void {
    this.engine.abort(this.requestId, this.submitted ?? undefined);
  }

  /**
   * The client went away: abort in the engine (pages freed; a request that already finished and holds
   * its pages for a peer has them freed too, as its answer is now never sent) and report nothing more.
   */
  cancel(): void {
    if (this.finished) return;
    this.cancelled = true;
    this.finished = true;
    this.engine.abort(this.requestId);
    this.observer?.finished('abort', this.api.promptTokenIds.length, this.completionTokens);
  }

  private onOutput(o: EngineOutput): void {
    if (this.finished) return;
    assert(o.requestId === this.requestId, 'an output for another request');
    this.cachedTokens = o.numCachedTokens;
    const piece = emptyPiece();
    let stoppedByString = false;
    o.newTokenIds.forEach((id, i) => {
      if (stoppedByString) return;
      this.timeToken();
      this.completionTokens++;
      const isLast = i === o.newTokenIds.length - 1;
      const isStopToken =
        isLast &&
        o.finishReason === 'stop' &&
        ((id === EOS_TOKEN_ID && !this.api.ignoreEos) || this.api.stopTokenIds.includes(id));
      const tokenText = decode([id]);
      piece.tokenIds.push(id);
      piece.tokenTexts.push(tokenText);
      piece.logprobs.push(o.newLogprobs[i] ?? null);
      piece.textOffsets.push(this.charsSoFar);
      this.charsSoFar += codePoints(tokenText); // vLLM's offsets are Python str lengths
      // Like vLLM: the stop token counts but its text is not returned, unless include_stop_str_in_output
      // asks for it (EOS is a special token: skipped either way).
      if (isStopToken && !(this.api.includeStopStr && id !== EOS_TOKEN_ID)) return;
      // EOS is a special token: its text is never returned, also when ignore_eos lets generation run past
      // it (vLLM's skip_special_tokens, which this server only accepts as true).
      if (id === EOS_TOKEN_ID) return;
      const r = this.stops.push(this.decoder.push(id));
      piece.text += r.text;
      stoppedByString = r.stopped;
    });
    if (stoppedByString) {
      this.finished = true;
      this.engine.abort(this.requestId); // free the pages now; the abort output is ignored
      this.observer?.finished('stop', this.api.promptTokenIds.length, this.completionTokens);
      this.reportPrefixCache();
      this.sink.onFinish({
        piece,
        finishReason: 'stop',
        stopReason: this.stops.matched,
        kvTransferParams: null,
        usage: this.usage(),
      });
      return;
    }
    if (o.finishReason === null) {
      if (piece.tokenIds.length > 0 || piece.text.length > 0) this.sink.onPiece(piece);
      return;
    }
    this.finished = true;
    if (o.finishReason === 'error' || o.finishReason === 'abort') {
      this.observer?.finished(o.finishReason, this.api.promptTokenIds.length, this.completionTokens);
      if (this.cancelled) return;
      this.sink.onError(
        o.error ?? new HandoffError('REQUEST_ABORTED', `request ${this.requestId} was aborted by the server`),
      );
      return;
    }
    this.finishAnswer(o, o.finishReason, piece);
  }

  /** The engine finished the request (stop or length): the text held back is released with the last piece. */
  private finishAnswer(o: EngineOutput, engineReason: ApiFinishReason, piece: Piece): void {
    // The detokenizer's held-back tail (a character never completed) may complete a stop string: then the
    // answer ended by it, as by one found on the way.
    const tail = this.stops.push(this.decoder.flush());
    piece.text += tail.text + this.stops.flush();
    const finishReason = tail.stopped ? 'stop' : engineReason;
    this.observer?.finished(finishReason, this.api.promptTokenIds.length, this.completionTokens);
    this.reportPrefixCache();
    this.sink.onFinish({
      piece,
      finishReason,
      stopReason: tail.stopped ? this.stops.matched : this.stopTokenOf(o),
      kvTransferParams: o.kvTransferParams,
      usage: this.usage(),
    });
  }

  /** Like vLLM's check_stop: EOS (unless ignored) stops with no reason, a stop token id is the reason. */
  private stopTokenOf(o: EngineOutput): number | null {
    const lastId = o.newTokenIds.at(-1);
    if (o.finishReason !== 'stop' || lastId === undefined) return null;
    if (lastId === EOS_TOKEN_ID && !this.api.ignoreEos) return null;
    return this.api.stopTokenIds.includes(lastId) ? lastId : null;
  }

  /** A request that loaded its KV from a prefill instance computed no prompt here: not a prefix-cache query. */
  private reportPrefixCache(): void {
    if (this.api.kvTransferParams?.do_remote_prefill !== true)
      this.observer?.prefixCache?.(this.api.promptTokenIds.length, this.cachedTokens);
  }

  private timeToken(): void {
    const now = this.env.nowMs();
    if (this.lastTokenMs === null) this.observer?.firstToken(now - this.startMs);
    else this.observer?.interToken(now - this.lastTokenMs);
    this.lastTokenMs = now;
  }

  private usage(): Usage {
    return usageOf(this.api.promptTokenIds.length, this.completionTokens);
  }
}

/** Characters in `s` as Python counts them (code points): a surrogate pair is one. */
function codePoints(s: string): number {
  let n = 0;
  for (const _ of s) n++;
  return n;
}
