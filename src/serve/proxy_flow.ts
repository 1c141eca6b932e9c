/**
 * The HTTP request bodies of the P/D legs: pdFlow (pd_flow.ts) decides what each side is asked; these
 * put it into an OpenAI request body, with vLLM's field names so a vLLM proxy and ours drive the same
 * servers the same way (reference spec §6.2). Prefill answers once (stream off, 1 token); decode gets
 * the ORIGINAL body plus the params pdFlow built.
 */
import type { IncomingMessage } from 'node:http';
import type { InstanceInfo } from './instance_server.ts';
import type { PrefillAsk, PrefillIdentity, TransferParams } from './pd_flow.ts';

type Body = Record<string, unknown>;

export function prefillBody(body: Body, ask: PrefillAsk): Body {
  const out: Body = { ...body, stream: false, max_tokens: ask.maxTokens, max_completion_tokens: ask.maxTokens };
  delete out['stream_options'];
  out['kv_transfer_params'] = ask.kvTransferParams;
  return out;
}

export function decodeBody(body: Body, params: TransferParams): Body {
  return { ...body, kv_transfer_params: params };
}

/** Prefill's identity from its GET /handoff/info (null: a server without it, e.g. vLLM). */
export function prefillIdentityOf(info: InstanceInfo | null): PrefillIdentity | null {
  if (info === null) return null;
  return {
    engineId: info.engine_id,
    sideChannelHost: info.side_channel_host,
    sideChannelPort: info.side_channel_port,
    transferMode: info.transfer_mode,
  };
}

/** Headers sent upstream: the request id and the client's credentials. */
export function forwardHeaders(req: IncomingMessage, requestId: string | null): Record<string, string> {
  const h: Record<string, string> = {};
  if (requestId !== null) h['x-request-id'] = requestId;
  if (typeof req.headers['authorization'] === 'string') h['authorization'] = req.headers['authorization'];
  return h;
}
