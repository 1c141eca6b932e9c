/**
 * Operating errors: bad input, peer gone, timeouts. Each has a stable `code` that clients and tests
 * match on, and an HTTP status used when the error reaches a client as OpenAI-style error JSON.
 */
export const ERROR_CODES = {
  BAD_REQUEST: 400,
  BAD_TRANSFER_PARAMS: 400,
  BAD_CONFIG: 400,
  PROMPT_TOO_LONG: 400,
  UNAUTHORIZED: 401,
  GRANT_DENIED: 403,
  PEER_NOT_ALLOWED: 403,
  NOT_FOUND: 404,
  PEER_INCOMPATIBLE: 409,
  REQUEST_ABORTED: 499,
  KV_LOAD_FAILED: 502,
  PEER_UNAVAILABLE: 502,
  TRANSFER_FAILED: 502,
  OUT_OF_PAGES: 503,
  OVERLOADED: 503,
  KV_READ_TIMEOUT: 504,
  TIMEOUT: 504,
  INTERNAL: 500,
} as const;

export type ErrorCode = keyof typeof ERROR_CODES;

/** Free-form details; `param` names the offending request field (OpenAI's `error.param`), e.g. `max_tokens`. */
export type ErrorDetails = Record<string, unknown> & { param?: string | undefined };

export class HandoffError extends Error {
  override name = 'HandoffError';
  readonly code: ErrorCode;
  readonly httpStatus: number;
  readonly details: ErrorDetails | undefined;
  /** The request field at fault (`kv_transfer_params.remote_block_ids`, `messages[0].content`), or null. */
  readonly param: string | null;

  constructor(code: ErrorCode, message: string, details?: ErrorDetails) {
    super(message);
    this.code = code;
    this.httpStatus = ERROR_CODES[code];
    this.details = details;
    this.param = typeof details?.param === 'string' ? details.param : null;
  }

  /** Plain data for the wire (OpenAI error shape). */
  toJSON(): { error: { message: string; type: string; code: ErrorCode; param: string | null } } {
    const type = this.httpStatus < 500 ? 'invalid_request_error' : 'server_error';
    return { error: { message: this.message, type, code: this.code, param: this.param } };
  }
}

export function isHandoffError(e: unknown): e is HandoffError {
  return e instanceof HandoffError;
}

/** Rebuild a HandoffError from its wire form (a peer's error JSON); unknown codes become INTERNAL. */
export function handoffErrorFromJSON(body: unknown, fallbackMessage: string): HandoffError {
  const err = (body as { error?: { code?: unknown; message?: unknown; param?: unknown } } | null)?.error;
  // Own keys only: `in` would take "constructor" or "toString" (Object.prototype) for a code.
  const code =
    typeof err?.code === 'string' && Object.hasOwn(ERROR_CODES, err.code) ? (err.code as ErrorCode) : 'INTERNAL';
  const message = typeof err?.message === 'string' ? err.message : fallbackMessage;
  return new HandoffError(code, message, typeof err?.param === 'string' ? { param: err.param } : undefined);
}

/**
 * A failed listen as one line a person can act on: `<what> port P on HOST is already in use` for
 * EADDRINUSE (also when the error crossed a thread and only its message says so).
 */
export function listenFailed(e: unknown, host: string, port: number, what = ''): HandoffError {
  const code = (e as { code?: unknown } | null)?.code;
  const message = e instanceof Error ? e.message : String(e);
  const prefix = what === '' ? '' : `${what} `;
  if (code === 'EADDRINUSE' || message.includes('EADDRINUSE'))
    return new HandoffError('BAD_CONFIG', `${prefix}port ${port} on ${host} is already in use`);
  return new HandoffError(
    'BAD_CONFIG',
    `cannot listen on ${host}:${port}${what === '' ? '' : ` (${what})`}: ${message}`,
  );
}
