/** Identifiers built from an Env's randomness (never Math.random). */
import type { Env } from './env.ts';

export function hexId(env: Env, bytes = 16): string {
  return Buffer.from(env.secureRandomBytes(bytes)).toString('hex');
}

/** Longest X-Request-Id accepted (serve/http_io.ts). */
export const REQUEST_ID_MAX = 128;

/**
 * An upstream attempt's own X-Request-Id (proxy, llm-d sidecar): the client's made unique,
 * `<id>.<16 hex>` (a retry `<id>.retryN.<16 hex>`), the client's part cut so that it stays a valid id. The
 * in-band cancel names it, so a client reusing another's id cannot cancel that one's request by leaving.
 */
export function upstreamRequestId(clientId: string, env: Env, attempt = 1): string {
  const suffix = `.${attempt === 1 ? '' : `retry${attempt - 1}.`}${hexId(env, 8)}`;
  return `${clientId.slice(0, REQUEST_ID_MAX - suffix.length)}${suffix}`;
}
