/**
 * Small node:http helpers shared by the instance server and the proxy: bounded JSON bodies, JSON and
 * OpenAI-style error responses, bearer-token checks and X-Request-Id handling. Every operating error
 * leaves here as `{error: {message, type, code, param}}` with the HandoffError's HTTP status.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { rethrowIfAssertion } from '../util/assert.ts';
import type { Env } from '../util/env.ts';
import { HandoffError, isHandoffError } from '../util/errors.ts';
import { hexId, REQUEST_ID_MAX } from '../util/ids.ts';
import type { Logger } from '../util/log.ts';
import { checkJsonShape } from './json_shape.ts';

export const REQUEST_ID_HEADER = 'x-request-id';
/** Bound on a request body (a prompt of maxModelLen tokens as JSON is far below this). */
export const MAX_BODY_BYTES = 4 << 20;
const REQUEST_ID_RE = new RegExp(`^[A-Za-z0-9._:@-]{1,${REQUEST_ID_MAX}}$`);
const utf8Strict = new TextDecoder('utf-8', { fatal: true });

/**
 * BAD_REQUEST unless the body is declared JSON (`application/json`, `application/<x>+json`) or not declared
 * at all, as vLLM's FastAPI takes it. A web page can make a browser POST `text/plain`, form or multipart
 * bodies anywhere without asking (no CORS preflight): parsed as JSON anyway, any page its user visited ran
 * completions, cancels and releases on a server without an API key (FastAPI's CVE-2021-32677).
 */
function checkJsonContentType(req: IncomingMessage): void {
  const declared = req.headers['content-type'];
  if (declared === undefined || declared.trim() === '') return;
  const type = (declared.split(';')[0] ?? '').trim().toLowerCase();
  if (type === 'application/json' || /^application\/[^/\s]+\+json$/.test(type)) return;
  throw new HandoffError('BAD_REQUEST', `Content-Type must be application/json, got '${declared.slice(0, 80)}'`);
}

/**
 * A body past its limit is still read to its end (and dropped), up to this many bytes, before the 400 goes
 * out: a reply sent while the client was still sending, its socket then destroyed under unread bytes, met
 * the client's next write as a reset (EPIPE), and the client never read the 400. Past this the connection
 * is cut.
 */
export const DRAIN_MAX_BYTES = 64 << 20;

/** Read the whole body (bounded) and parse it as a JSON object; BAD_REQUEST otherwise. */
export async function readJsonBody(req: IncomingMessage, maxBytes = MAX_BODY_BYTES): Promise<Record<string, unknown>> {
  checkJsonContentType(req);
  const tooLarge = (): HandoffError => new HandoffError('BAD_REQUEST', `request body is larger than ${maxBytes} bytes`);
  if (Number(req.headers['content-length']) > DRAIN_MAX_BYTES) throw tooLarge();
  const chunks: Buffer[] = [];
  let total = 0;
  try {
    for await (const chunk of req) {
      const b = chunk as Buffer;
      total += b.length;
      if (total > DRAIN_MAX_BYTES) throw tooLarge();
      if (total <= maxBytes) chunks.push(b);
    }
    if (total > maxBytes) throw tooLarge();
  } catch (e) {
    // The client went away mid-body (the socket's "aborted" error): its doing, not an internal error.
    if (isHandoffError(e) || !req.destroyed) throw e;
    throw new HandoffError('REQUEST_ABORTED', 'the client went away while sending its request');
  }
  const bytes = Buffer.concat(chunks);
  let text: string;
  try {
    text = utf8Strict.decode(bytes);
  } catch (e) {
    if (!(e instanceof TypeError)) throw e;
    // JSON on the wire is UTF-8 (RFC 8259): a replacement character would silently change the prompt.
    throw new HandoffError('BAD_REQUEST', 'request body is not valid UTF-8');
  }
  // Before JSON.parse: its time depends on the body's shape, not only its size (json_shape.ts).
  checkJsonShape(bytes);
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    if (!(e instanceof SyntaxError)) throw e;
    throw new HandoffError('BAD_REQUEST', `request body is not valid JSON: ${(e as Error).message}`);
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value))
    throw new HandoffError('BAD_REQUEST', 'request body must be a JSON object');
  return value as Record<string, unknown>;
}

export function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  const text = JSON.stringify(body);
  // A request body we stopped reading half way (too large) would stall the next request on this
  // keep-alive connection: close the connection after this response. (Node drains bodies never read.)
  const close: Record<string, string> =
    res.req !== undefined && res.req.readableDidRead && !res.req.complete ? { connection: 'close' } : {};
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
    ...headers,
    ...close,
  });
  res.end(text);
}

/**
 * Any thrown value → OpenAI error JSON. Non-HandoffErrors are bugs: logged, answered as INTERNAL; an
 * AssertionFailure is re-thrown (see toHandoffError).
 */
export function sendError(res: ServerResponse, e: unknown, log?: Logger, headers: Record<string, string> = {}): void {
  const err = toHandoffError(e, log);
  sendJson(res, err.httpStatus, err.toJSON(), headers);
}

/**
 * A HandoffError as it is; any other Error as INTERNAL (logged). An AssertionFailure is re-thrown: a
 * programmer error inside a request handler crashes the process instead of hiding behind a 500.
 */
export function toHandoffError(e: unknown, log?: Logger): HandoffError {
  if (isHandoffError(e)) return e;
  rethrowIfAssertion(e);
  log?.error({ err: e }, 'unexpected error while serving a request');
  return new HandoffError('INTERNAL', `internal error: ${e instanceof Error ? e.message : String(e)}`);
}

/** An error answered with another status than its code's (e.g. an upstream's status in the proxy). */
export function sendErrorWithStatus(
  res: ServerResponse,
  status: number,
  err: HandoffError,
  headers: Record<string, string> = {},
): void {
  sendJson(res, status, err.toJSON(), headers);
}

/** The client's X-Request-Id if well formed (BAD_REQUEST if malformed), else a new one. */
export function requestIdOf(req: IncomingMessage, env: Env): string {
  const raw = req.headers[REQUEST_ID_HEADER];
  if (raw === undefined) return hexId(env, 12);
  const v = Array.isArray(raw) ? (raw[0] ?? '') : raw;
  if (!REQUEST_ID_RE.test(v))
    throw new HandoffError('BAD_REQUEST', 'X-Request-Id must be 1-128 characters of [A-Za-z0-9._:@-]');
  return v;
}

/** Constant-time check of `Authorization: Bearer <key>`; UNAUTHORIZED when it does not match. */
export function checkBearer(req: IncomingMessage, apiKey: string | null): void {
  if (apiKey === null) return;
  const header = req.headers['authorization'] ?? '';
  const m = /^Bearer\s+(.+)$/i.exec(header);
  const given = createHash('sha256')
    .update(m?.[1] ?? '')
    .digest();
  const want = createHash('sha256').update(apiKey).digest();
  if (!m || !timingSafeEqual(given, want))
    throw new HandoffError('UNAUTHORIZED', 'missing or wrong API key (Authorization: Bearer <key>)');
}

/** Path without the query string. */
export function pathOf(req: IncomingMessage): string {
  const url = req.url ?? '/';
  const q = url.indexOf('?');
  return q < 0 ? url : url.slice(0, q);
}

/** True when the response was not completed (the client went away first). */
export function clientGone(res: ServerResponse): boolean {
  return !res.writableFinished;
}

/** JSON.parse of text from the network: a SyntaxError becomes `bad()` (an operating error), nothing else is caught. */
export function parseJsonText(text: string, bad: () => Error): unknown {
  try {
    return JSON.parse(text);
  } catch (e) {
    if (!(e instanceof SyntaxError)) throw e;
    throw bad();
  }
}
