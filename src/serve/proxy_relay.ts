/**
 * The proxy's answer to its client: decode's response relayed unchanged (status, content type, bytes).
 * JSON is read whole first, so a decode that dies mid-answer fails the attempt before anything was sent
 * (the proxy may retry it elsewhere); a stream is relayed chunk by chunk, and one that breaks after it
 * started ends with an error event in its own format.
 */
import { once } from 'node:events';
import type { ServerResponse } from 'node:http';
import { rethrowIfAssertion } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { parseJsonText } from './http_io.ts';
import { SSE_DONE, sseEvent } from './sse.ts';
import { abortedBecause, readBounded, UPSTREAM_BODY_MAX_BYTES } from './upstream.ts';

/** A client that takes no byte for this long while the proxy has some for it is dropped. */
export const CLIENT_STALL_MS = 30_000;
/** An event still open at this size is relayed as it is (a peer that never ends one cannot grow memory). */
const PARTIAL_EVENT_MAX_BYTES = 1 << 20;

/**
 * Responses whose stream was cut by an upstream failure or carried an upstream's error event (a decode
 * that failed the request after its stream started: 200, then `data: {"error": ...}`): not an ok completion.
 */
export const cutMidStream = new WeakSet<ServerResponse>();

/** An error event among whole SSE events (no false match: a JSON string holds no raw newline). */
function hasErrorEvent(events: Uint8Array): boolean {
  const b = Buffer.from(events.buffer, events.byteOffset, events.byteLength);
  return b.includes('"error"') && /^data: ?\{\s*"error"\s*:/m.test(b.toString('utf8'));
}

const DONE_AT_END_RE = /(?:^|\n)data: ?\[DONE\]\r?\n\r?\n$/;

/** Whole events whose last one is `data: [DONE]`. */
function endsWithDone(events: Uint8Array): boolean {
  const tail = events.subarray(Math.max(0, events.length - 32));
  return DONE_AT_END_RE.test(Buffer.from(tail.buffer, tail.byteOffset, tail.byteLength).toString('latin1'));
}

/** The bytes left after the last blank line are a `[DONE]` event whose blank line never came. */
function isDone(open: Uint8Array): boolean {
  return open.length <= 32 && /^\s*data: ?\[DONE\]\s*$/.test(Buffer.from(open).toString('latin1'));
}

/** Index just past the last blank line of `b` (an SSE event boundary: LF LF or LF CR LF), or 0. */
export function lastEventEnd(b: Uint8Array): number {
  for (let i = b.length - 1; i >= 1; i--) {
    if (b[i] !== 0x0a) continue;
    if (b[i - 1] === 0x0a) return i + 1;
    if (b[i - 1] === 0x0d && i >= 2 && b[i - 2] === 0x0a) return i + 1;
  }
  return 0;
}

/** Wait for the client to take what was written: false if it took nothing for `stallMs`. */
async function drained(res: ServerResponse, signal: AbortSignal, env: Env, stallMs: number): Promise<boolean> {
  const ac = new AbortController();
  let stalled = false;
  const timer = env.setTimer(stallMs, () => {
    stalled = true;
    ac.abort();
  });
  const onAbort = (): void => ac.abort();
  signal.addEventListener('abort', onAbort, { once: true });
  try {
    await once(res, 'drain', { signal: ac.signal });
    return true;
  } catch (e) {
    rethrowIfAssertion(e);
    if (stalled) return false;
    throw e;
  } finally {
    timer.cancel();
    signal.removeEventListener('abort', onAbort);
  }
}

/** The body read was `bytes` long, as its Content-Length said (not encoded: fetch counts decoded bytes). */
function hasAllItsBytes(r: Response, bytes: number): boolean {
  const length = r.headers.get('content-length');
  const encoding = r.headers.get('content-encoding');
  return (
    length !== null &&
    (encoding === null || encoding === 'identity') &&
    /^\d+$/.test(length) &&
    Number(length) === bytes
  );
}

/** Stream the decode response back unchanged (status, content type, bytes). */
export async function relay(
  r: Response,
  res: ServerResponse,
  signal: AbortSignal,
  env: Env,
  stallMs = CLIENT_STALL_MS,
): Promise<void> {
  const contentType = r.headers.get('content-type') ?? 'application/json';
  if (!contentType.startsWith('text/event-stream') && r.body) {
    // A JSON answer is read whole before anything is sent: a decode that dies mid-answer (a broken
    // connection, no details) fails this attempt, which may then be retried elsewhere.
    let text: string;
    let bytes: number;
    try {
      ({ text, bytes } = await readBounded(r, UPSTREAM_BODY_MAX_BYTES, 'the decode instance'));
    } catch (e) {
      rethrowIfAssertion(e);
      if (e instanceof HandoffError) throw e;
      if (signal.aborted) throw abortedBecause(signal);
      throw new HandoffError('PEER_UNAVAILABLE', `decode instance failed mid-response: ${(e as Error).message}`);
    }
    // A close-delimited body cut by a dying decode ends cleanly: only its parse tells it is not whole. One
    // with a Content-Length is whole once that many bytes came (fetch fails a shorter one): no parse of up
    // to 64 MiB on the event loop (an answer with logprobs took seconds).
    if (contentType.startsWith('application/json') && !hasAllItsBytes(r, bytes))
      parseJsonText(text, () => new HandoffError('PEER_UNAVAILABLE', 'decode instance answered JSON cut short'));
    res.writeHead(r.status, { 'content-type': contentType, 'cache-control': 'no-cache' });
    res.end(text);
    return;
  }
  res.writeHead(r.status, { 'content-type': contentType, 'cache-control': 'no-cache' });
  if (!r.body) {
    res.end();
    return;
  }
  await relayEvents(r.body, res, signal, env, stallMs);
}

/**
 * Relay an event stream whole events at a time (an event cut by a dying decode is never half sent, so
 * the error event that ends the stream parses); a client that stops reading is dropped after
 * `stallMs`; a leg cancelled by the flow (not by the client), or a stream that ends before its
 * `data: [DONE]`, still ends with an error event.
 */
async function relayEvents(
  body: ReadableStream<Uint8Array>,
  res: ServerResponse,
  signal: AbortSignal,
  env: Env,
  stallMs: number,
): Promise<void> {
  let open: Uint8Array = new Uint8Array(0);
  /** The last whole event relayed was `data: [DONE]`. */
  let done = false;
  try {
    for await (const chunk of body) {
      const bytes = open.length === 0 ? chunk : Buffer.concat([open, chunk]);
      const end = bytes.length > PARTIAL_EVENT_MAX_BYTES ? bytes.length : lastEventEnd(bytes);
      open = bytes.subarray(end);
      if (end === 0) continue;
      if (hasErrorEvent(bytes.subarray(0, end))) cutMidStream.add(res);
      done = endsWithDone(bytes.subarray(0, end));
      if (!res.write(bytes.subarray(0, end)) && !(await drained(res, signal, env, stallMs))) {
        res.destroy();
        throw new HandoffError('REQUEST_ABORTED', `the client took nothing for ${stallMs / 1000} s`);
      }
    }
    if (done || isDone(open)) return void res.end(open);
    // A clean end of body before [DONE] (a close-delimited stream whose decode died): not a whole answer.
    const err = new HandoffError('PEER_UNAVAILABLE', 'decode instance ended its stream before [DONE]');
    cutMidStream.add(res);
    res.end(sseEvent(err.toJSON()) + SSE_DONE);
  } catch (e) {
    rethrowIfAssertion(e);
    // (The upstream timeout's reason is a HandoffError too: it is told to the client below.)
    if (e instanceof HandoffError && e !== signal.reason) throw e;
    if (res.destroyed) throw new HandoffError('REQUEST_ABORTED', 'the client went away');
    if (res.writableNeedDrain) {
      // Cut while waiting for a client that stopped reading (the upstream timed out meanwhile).
      res.destroy();
      throw new HandoffError('REQUEST_ABORTED', 'the client stopped reading');
    }
    // The decode instance died mid-response, its answer outlived the upstream timeout, or the flow
    // cancelled it: say so in the stream's own format.
    const timeout = signal.aborted ? abortedBecause(signal) : null;
    const err =
      timeout?.code === 'TIMEOUT'
        ? timeout
        : new HandoffError(
            'PEER_UNAVAILABLE',
            `${signal.aborted ? 'the request was cancelled mid-response' : 'decode instance failed mid-response'}: ${(e as Error).message}`,
          );
    cutMidStream.add(res);
    res.end(sseEvent(err.toJSON()) + SSE_DONE);
  }
}
