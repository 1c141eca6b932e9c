/**
 * llm-d's routing-sidecar protocol, spoken by a decode instance itself, so an llm-d-style router (its
 * EPP picks decode, and names a prefiller in a header) can drive handoff pools without a sidecar:
 *
 *   router ──POST /v1/completions, x-prefiller-host-port: host:port──> decode
 *   decode ──(1) the body with max_tokens 1, stream off, kv_transfer_params {do_remote_decode: true,
 *              do_remote_prefill: false, transfer_id}──> http://host:port/v1/completions (prefiller)
 *          <── its kv_transfer_params (remote_engine_id, remote_block_ids, remote_host/port, grant...)
 *   decode ──(2) the original body + those params (do_remote_prefill: true), run here: READ, decode,
 *              answer the router (stream or JSON) as any request
 *
 * The flow is pdFlow's READ flow (pd_flow.ts), the same one the proxy runs; only the legs differ.
 * Validation at the edge: the header must be one `host:port` (400 otherwise), the host:port must pass
 * this instance's --kv-peers allow-list (403 PEER_NOT_ALLOWED, nothing contacted), the instance must be
 * a READ-mode decode, and the body must not carry kv_transfer_params of its own.
 */
import type { IncomingMessage } from 'node:http';
import type { Env } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';
import { hexId } from '../util/ids.ts';
import { peerAllowed, type PeerAllowList } from '../connector/peer_directory.ts';
import { pdFlow, type TransferParams } from './pd_flow.ts';
import { prefillBody, decodeBody } from './proxy_flow.ts';
import { callUpstream, inBandCancel, readAnswer, upstreamError } from './upstream.ts';

export const PREFILLER_HEADER = 'x-prefiller-host-port';
const PARAM = PREFILLER_HEADER;

export interface Prefiller {
  host: string;
  port: number;
}

const bad = (message: string): HandoffError => new HandoffError('BAD_REQUEST', message, { param: PARAM });

/** The prefiller a request names, validated; null when the header is absent. */
export function prefillerOf(req: IncomingMessage, allow: PeerAllowList): Prefiller | null {
  const raw = req.headers[PREFILLER_HEADER];
  // Empty: no prefiller, as llm-d's sidecar takes it (its EPP clears the header to "" when it picks none).
  if (raw === undefined || (typeof raw === 'string' && raw.trim() === '')) return null;
  if (Array.isArray(raw) || raw.includes(',')) throw bad(`${PREFILLER_HEADER} must name exactly one host:port`);
  const m = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]{1,253}):(\d{1,5})$/.exec(raw.trim());
  const port = Number(m?.[2]);
  if (m === null || !(port >= 1 && port <= 65535))
    throw bad(`${PREFILLER_HEADER} must be host:port, got '${raw.slice(0, 80)}'`);
  const host = m[1] as string;
  if (!peerAllowed(allow, host, port))
    throw new HandoffError('PEER_NOT_ALLOWED', `prefiller ${host}:${port} is not an allowed peer (see --kv-peers)`, {
      param: PARAM,
    });
  return { host, port };
}

export interface SidecarCall {
  prefiller: Prefiller;
  path: string;
  body: Record<string, unknown>;
  /** Forwarded to the prefiller: the request id and the client's credentials. */
  headers: Record<string, string>;
  /** The client went away. */
  signal: AbortSignal;
  timeoutMs: number;
}

export interface SidecarLegs {
  /** Run the request here with the body that carries prefill's params (resolves once it is under way). */
  decode(body: Record<string, unknown>): Promise<void>;
  /** The client left after the prefiller answered: release its pages now. */
  releaseUnused(params: TransferParams): void;
}

/** Prefill on the named prefiller, then decode here, by pdFlow's READ flow. */
export function runSidecar(env: Env, call: SidecarCall, legs: SidecarLegs): Promise<void> {
  if (call.body['kv_transfer_params'] !== undefined && call.body['kv_transfer_params'] !== null)
    throw bad(`a request with ${PREFILLER_HEADER} must not carry kv_transfer_params: the prefiller's are used`);
  const { host, port } = call.prefiller;
  const url = `http://${host}:${port}${call.path}`;
  return pdFlow<void>(
    {
      prefill: async (ask, signal) => {
        // The client leaving is told to the prefiller in band where it can be (upstream.ts inBandCancel).
        const base = `http://${host}:${port}`;
        const leg = inBandCancel(env, undefined, { base, headers: call.headers, timeoutMs: 2000 }, signal);
        const u = await callUpstream(env, {
          method: 'POST',
          url,
          body: prefillBody(call.body, ask),
          headers: call.headers,
          signal: leg.signal,
          signalUntilHeaders: true,
          timeoutMs: call.timeoutMs,
        }).finally(() => leg.dispose());
        try {
          if (!u.response.ok) throw await upstreamError('prefill', u.response);
          // Bounded and checked like the proxy's: a broken answer is the prefiller failing (502), not ours.
          const answer = await readAnswer(u.response, 'prefill');
          return { kvTransferParams: answer['kv_transfer_params'] };
        } finally {
          u.done();
        }
      },
      decode: (params) => legs.decode(decodeBody(call.body, params)),
      releaseUnused: (params) => legs.releaseUnused(params),
    },
    { mode: 'read', transferId: `sidecar-${hexId(env, 12)}`, signal: call.signal },
  );
}
