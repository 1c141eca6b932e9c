/**
 * HTTP calls from the proxy to its instances (global fetch), bounded by a timeout on the Env's timers
 * and cancellable by the client's disconnect. Failures become HandoffErrors: PEER_UNAVAILABLE when the
 * instance cannot be reached, TIMEOUT when it does not answer in time, and an upstream error response
 * becomes the instance's own error (code and message) with the instance's HTTP status.
 */
import { rethrowIfAssertion } from '../util/assert.ts';
import type { Env, TimerHandle } from '../util/env.ts';
import { HandoffError, handoffErrorFromJSON, type ErrorCode } from '../util/errors.ts';
import type { Logger } from '../util/log.ts';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { pathOf, readJsonBody, sendJson } from './http_io.ts';
import { forwardHeaders } from './proxy_flow.ts';

/** An upstream failure answered with the upstream's own HTTP status. */
export function withStatus(err: HandoffError, status: number): HandoffError {
  return new HandoffError(err.code, err.message, {
    upstreamStatus: status,
    ...(err.param !== null ? { param: err.param } : {}),
  });
}

/** Paths the proxy passes to a decode instance, with their method: /v1/models and vLLM's tokenizer endpoints. */
export const PASSED_TO_DECODE: ReadonlyMap<string, string> = new Map([
  ['/v1/models', 'GET'],
  ['/version', 'GET'],
  ['/tokenize', 'POST'],
  ['/detokenize', 'POST'],
]);

/** One of those requests, sent to the instance at `baseUrl`; its answer (or error, with its status) is the client's. */
export async function passThrough(
  env: Env,
  baseUrl: string,
  req: IncomingMessage,
  res: ServerResponse,
  timeoutMs: number,
): Promise<void> {
  const body = req.method === 'POST' ? await readJsonBody(req) : undefined;
  const u = await callUpstream(env, {
    method: req.method === 'POST' ? 'POST' : 'GET',
    url: `${baseUrl}${pathOf(req)}`,
    headers: forwardHeaders(req, null),
    ...(body === undefined ? {} : { body }),
    timeoutMs,
  });
  try {
    // The instance's own error, word for word: the client asked the server, not the proxy's decode leg.
    if (!u.response.ok) throw withStatus(await upstreamError('decode', u.response, false), u.response.status);
    sendJson(res, 200, await readAnswer(u.response, 'decode'));
  } finally {
    u.done();
  }
}

export interface UpstreamCall {
  method: 'GET' | 'POST';
  url: string;
  body?: unknown;
  headers?: Record<string, string>;
  timeoutMs: number;
  /** Aborts the call (the client went away). */
  signal?: AbortSignal;
  /** The signal aborts only until the headers are in; the body is then read to the end regardless. */
  signalUntilHeaders?: boolean;
}

export interface UpstreamResponse {
  response: Response;
  /** Aborted when the call ends early: its timeout, or the caller's signal (before done()). */
  signal: AbortSignal;
  /** Cancels the body if it is still being read (and clears the timeout). */
  done(): void;
}

const UNDICI_GLOBAL_DISPATCHER = Symbol.for('undici.globalDispatcher.1');
let unbounded: object | null = null;

/**
 * The dispatcher of every upstream call: Node's fetch (its bundled undici) with its own bounds off.
 * undici waits at most 300 s for a response's headers and between two body chunks, beneath `timeoutMs`:
 * an instance sends a JSON answer's headers with the whole answer (a stream's with its first token), so
 * a completion longer than 300 s failed as "cannot reach" (502, the instance marked down) although the
 * proxy waits upstreamTimeoutMs (600 s). Node 20 does not export undici's Agent: this one is built like
 * the global dispatcher (which exists once fetch was called; a `data:` URL makes it without I/O).
 * Undefined (undici's defaults) if the global dispatcher was replaced by another kind.
 */
function upstreamDispatcher(): object | undefined {
  if (unbounded !== null) return unbounded;
  const slot = globalThis as unknown as Record<symbol, unknown>;
  // catch-ok: nothing is read from a data: URL; the call only has Node load undici and its dispatcher
  if (slot[UNDICI_GLOBAL_DISPATCHER] === undefined) void fetch('data:,').catch(() => undefined);
  const global = slot[UNDICI_GLOBAL_DISPATCHER];
  if (typeof global !== 'object' || global === null || global.constructor.name !== 'Agent') return undefined;
  const Agent = global.constructor as new (o: { headersTimeout: number; bodyTimeout: number }) => object;
  unbounded = new Agent({ headersTimeout: 0, bodyTimeout: 0 });
  return unbounded;
}

/** Send a request; resolves once the headers are in. The timeout also covers reading the body until done(). */
export async function callUpstream(env: Env, call: UpstreamCall): Promise<UpstreamResponse> {
  // A signal aborted already (the client left while the proxy waited) sends nothing: no work for nobody.
  if (call.signal?.aborted) throw new HandoffError('REQUEST_ABORTED', 'the client went away');
  const ac = new AbortController();
  let timedOut = false;
  let headersIn = false;
  // The reason tells a relay reading the body that this was the timeout, not a client that left.
  const timer = env.setTimer(call.timeoutMs, () => {
    timedOut = true;
    const what = headersIn ? 'did not finish its answer' : 'did not answer';
    ac.abort(new HandoffError('TIMEOUT', `${call.url} ${what} within ${call.timeoutMs} ms`));
  });
  const onAbort = (): void => ac.abort();
  call.signal?.addEventListener('abort', onAbort, { once: true });
  const cleanup = (): void => {
    timer.cancel();
    call.signal?.removeEventListener('abort', onAbort);
  };
  try {
    const response = await fetch(call.url, {
      method: call.method,
      headers: { ...(call.body !== undefined ? { 'content-type': 'application/json' } : {}), ...call.headers },
      ...(call.body !== undefined ? { body: JSON.stringify(call.body) } : {}),
      signal: ac.signal,
      dispatcher: upstreamDispatcher(),
    } as RequestInit);
    headersIn = true;
    if (call.signalUntilHeaders) call.signal?.removeEventListener('abort', onAbort);
    return {
      response,
      signal: ac.signal,
      done: () => {
        cleanup();
        // catch-ok: cancelling a body nobody reads; a failure (the socket already gone) changes nothing
        if (!response.bodyUsed) void response.body?.cancel().catch(() => undefined);
      },
    };
  } catch (e) {
    rethrowIfAssertion(e);
    cleanup();
    if (timedOut) throw new HandoffError('TIMEOUT', `${call.url} did not answer within ${call.timeoutMs} ms`);
    if (call.signal?.aborted) throw new HandoffError('REQUEST_ABORTED', 'the client went away');
    const cause = (e as { cause?: { code?: string; message?: string } }).cause;
    throw new HandoffError(
      'PEER_UNAVAILABLE',
      `cannot reach ${call.url}: ${cause?.code ?? cause?.message ?? (e as Error).message}`,
    );
  }
}

/**
 * callUpstream, given up as PEER_UNAVAILABLE when `gone` aborts before the answer's headers are in (the
 * instance was taken out as unreachable: a frozen one never answers, and the request may be retried
 * elsewhere instead of waiting for the whole timeout). After the headers, `gone` still aborts the body
 * until done() (unless signalUntilHeaders): a stream whose decode froze ends with an error event instead
 * of holding its client for the whole timeout (600 s).
 */
export async function callUnlessGone(
  env: Env,
  { gone, ...call }: UpstreamCall & { gone: AbortSignal },
): Promise<UpstreamResponse> {
  const ac = new AbortController();
  const client = call.signal;
  const abort = (): void => ac.abort();
  if (client?.aborted === true || gone.aborted) ac.abort();
  client?.addEventListener('abort', abort, { once: true });
  gone.addEventListener('abort', abort, { once: true });
  const unlisten = (): void => gone.removeEventListener('abort', abort);
  try {
    const u = await callUpstream(env, { ...call, signal: ac.signal });
    return {
      ...u,
      done: () => {
        unlisten();
        u.done();
      },
    };
  } catch (e) {
    unlisten();
    rethrowIfAssertion(e);
    if (e instanceof HandoffError && e.code === 'REQUEST_ABORTED' && gone.aborted && client?.aborted !== true)
      throw new HandoffError('PEER_UNAVAILABLE', `${call.url} was taken out (unreachable) before it answered`);
    throw e;
  }
}

/**
 * Why a relay's signal aborted: the upstream's timeout (its reason, a HandoffError `TIMEOUT`) or a
 * client that went away (any other reason).
 */
export function abortedBecause(signal: AbortSignal): HandoffError {
  const r: unknown = signal.reason;
  return r instanceof HandoffError ? r : new HandoffError('REQUEST_ABORTED', 'the client went away');
}

/**
 * A best-effort POST to an instance (a release, a cancel): its answer is not needed, and a failure is
 * logged as `what` (the caller has a fallback: a lease, a request that runs to its end).
 */
export async function notifyUpstream(
  env: Env,
  log: Logger | undefined,
  n: { url: string; body: Record<string, unknown>; headers: Record<string, string>; what: string },
  o: { healthTimeoutMs: number },
): Promise<void> {
  try {
    const u = await callUpstream(env, {
      method: 'POST',
      url: n.url,
      body: n.body,
      headers: n.headers,
      timeoutMs: o.healthTimeoutMs,
    });
    u.done();
  } catch (e) {
    rethrowIfAssertion(e);
    log?.warn({ url: n.url, err: (e as Error).message }, n.what);
  }
}

/** How long a prefill leg cancelled in band waits for its answer before its connection is dropped. */
export const CANCELLED_ANSWER_MS = 10_000;

/**
 * The abort of a prefill leg, told in band: when `client` aborts, POST `${base}/handoff/cancel`
 * {request_id} and keep the leg's connection, so an answer already sent still arrives, and with it the
 * params of the pages it holds, which the flow then releases through decode. The returned signal (for
 * the leg's own call) aborts, dropping the connection as before, only if the prefiller cannot be told
 * (no such route: a vLLM prefiller; an error), or if it was told (or the cancel timed out: it may still
 * come) but its answer (the abort, or the answer it had already sent) is not in within CANCELLED_ANSWER_MS.
 */
export function inBandCancel(
  env: Env,
  log: Logger | undefined,
  leg: { base: string; headers: Record<string, string>; timeoutMs: number },
  client: AbortSignal,
): { signal: AbortSignal; dispose(): void } {
  const drop = new AbortController();
  let late: TimerHandle | null = null;
  let disposed = false;
  const onAbort = (): void => {
    const id = leg.headers['x-request-id'];
    if (id === undefined) return drop.abort();
    const body = { request_id: id };
    const url = `${leg.base}/handoff/cancel`;
    void callUpstream(env, { method: 'POST', url, body, headers: leg.headers, timeoutMs: leg.timeoutMs }).then(
      (u) => {
        if (!u.response.ok) drop.abort();
        else if (!disposed) late = env.setTimer(CANCELLED_ANSWER_MS, () => drop.abort());
        u.done();
      },
      (e: unknown) => {
        rethrowIfAssertion(e);
        // A cancel that timed out may still have reached a busy prefiller, and its answer (with the pages
        // it holds) may be on its way: wait for it as for a cancel taken. Dropping the connection lost
        // that answer, leaving the pages to the lease (`soak --abort-rate` on a loaded machine).
        const slow = e instanceof HandoffError && e.code === 'TIMEOUT';
        log?.warn(
          { url, err: (e as Error).message },
          `in-band cancel failed: ${slow ? 'waiting' : 'dropping the connection'}`,
        );
        if (!slow) drop.abort();
        else if (!disposed) late = env.setTimer(CANCELLED_ANSWER_MS, () => drop.abort());
      },
    );
  };
  if (client.aborted) onAbort();
  else client.addEventListener('abort', onAbort, { once: true });
  return {
    signal: drop.signal,
    dispose: () => {
      disposed = true;
      client.removeEventListener('abort', onAbort);
      late?.cancel();
    },
  };
}

/**
 * An upstream error response as one HandoffError (its code when it sent OpenAI error JSON); the message
 * names the side (`prefill: ...`) unless `named` is false.
 */
export async function upstreamError(side: string, r: Response, named = true): Promise<HandoffError> {
  // catch-ok: the body of an error response is only decoration for the message; a failed read leaves it empty
  const text = await readBoundedText(r, 1 << 20, `the ${side} instance's error`).catch(() => '');
  let parsed: unknown = null;
  try {
    parsed = JSON.parse(text);
    // catch-ok: only JSON.parse runs in the try: a body that is not JSON keeps the fallback message
  } catch {
    parsed = null;
  }
  const fallback = `${side} instance answered HTTP ${r.status}${text ? `: ${text.slice(0, 200)}` : ''}`;
  const err = handoffErrorFromJSON(parsed, fallback);
  // A code that is not ours (vLLM's numeric 400) says no more than the status: the status names the code.
  const ours = (parsed as { error?: { code?: unknown } } | null)?.error?.code === err.code;
  const code = ours ? err.code : codeOfStatus(r.status);
  const message = named ? `${side}: ${err.message}` : err.message;
  return new HandoffError(code, message, err.param !== null ? { param: err.param } : undefined);
}

/** The code a foreign error answer gets from its HTTP status. */
function codeOfStatus(status: number): ErrorCode {
  const byStatus: Record<number, ErrorCode> = {
    400: 'BAD_REQUEST',
    401: 'UNAUTHORIZED',
    404: 'NOT_FOUND',
    413: 'BAD_REQUEST',
    422: 'BAD_REQUEST',
    429: 'OVERLOADED',
    502: 'PEER_UNAVAILABLE',
    503: 'OVERLOADED',
    504: 'TIMEOUT',
  };
  return byStatus[status] ?? (status >= 400 && status < 500 ? 'BAD_REQUEST' : 'INTERNAL');
}

/** Bodies the proxy reads whole (JSON answers, error bodies) are refused past this size. */
export const UPSTREAM_BODY_MAX_BYTES = 64 << 20;

/**
 * A response body as text, at most `maxBytes` (a peer that never stops sending cannot grow memory):
 * PEER_UNAVAILABLE past it, the rest cancelled. Reading errors are the caller's. `onChunk` hears each
 * chunk as it comes (a caller's stall timer: a long body that keeps coming is not silence).
 */
export async function readBoundedText(
  r: Response,
  maxBytes: number,
  what: string,
  onChunk?: () => void,
): Promise<string> {
  return (await readBounded(r, maxBytes, what, onChunk)).text;
}

/** readBoundedText, with the number of body bytes it read (as fetch delivered them, decoded if encoded). */
export async function readBounded(
  r: Response,
  maxBytes: number,
  what: string,
  onChunk?: () => void,
): Promise<{ text: string; bytes: number }> {
  if (r.body === null) return { text: '', bytes: 0 };
  const decoder = new TextDecoder();
  const parts: string[] = [];
  let bytes = 0;
  for await (const chunk of r.body) {
    onChunk?.();
    bytes += chunk.byteLength;
    // Leaving the loop by this throw cancels the rest of the body (the stream's iterator does).
    if (bytes > maxBytes) throw new HandoffError('PEER_UNAVAILABLE', `${what} sent more than ${maxBytes} bytes`);
    parts.push(decoder.decode(chunk, { stream: true }));
  }
  parts.push(decoder.decode());
  return { text: parts.join(''), bytes };
}

/**
 * A 2xx JSON answer read whole. A body that breaks off or is not a JSON object is the instance failing
 * (PEER_UNAVAILABLE: the proxy takes it out and may retry elsewhere), not a bug of ours.
 */
export async function readAnswer(r: Response, role: 'prefill' | 'decode'): Promise<Record<string, unknown>> {
  let v: unknown;
  try {
    v = JSON.parse(await readBoundedText(r, UPSTREAM_BODY_MAX_BYTES, `the ${role} instance`));
  } catch (e) {
    rethrowIfAssertion(e);
    if (e instanceof HandoffError) throw e;
    throw new HandoffError('PEER_UNAVAILABLE', `${role} instance failed mid-answer: ${(e as Error).message}`);
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v))
    throw new HandoffError('PEER_UNAVAILABLE', `${role} instance answered something that is not a JSON object`);
  return v as Record<string, unknown>;
}
