/**
 * The HTTP request bodies of the P/D legs: pdFlow (pd_flow.ts) decides what each side is asked; these
 * put it into an OpenAI request body, with vLLM's field names so a vLLM proxy and ours drive the same
 * servers the same way (reference spec §6.2). Prefill answers once (stream off, 1 token); decode gets
 * the ORIGINAL body plus the params pdFlow built.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { HandoffError } from '../util/errors.ts';
import type { PoolMember } from './instance_pool.ts';
import type { InstanceInfo } from './instance_server.ts';
import { tokenizedApiRequest, validateApiRequest, type ApiKind, type ValidatedRequest } from './openai_request.ts';
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

/**
 * What decode would refuse, checked before prefill computes anything: the request is refused only when no
 * decode that published its limits takes it (the largest one's error). `unfit` names the instances that
 * would refuse it, for routing to skip: decodes, and prefills too short for the prompt while another takes
 * it. Instances may run different --max-model-len: checking against the smallest decode refused what a
 * larger one serves, and a prefill too short answered a 400 another prefill would not have. Null when no
 * decode published limits (e.g. vLLM validates for itself).
 */
export async function checkLimits(
  kind: ApiKind,
  body: unknown,
  pools: { prefill: readonly PoolMember[]; decode: readonly PoolMember[] },
  encodeText: (text: string) => Promise<number[]>,
): Promise<{ tokenIds: number[]; unfit: PoolMember[] } | null> {
  const lens = pools.decode.flatMap((m) => (m.info ? [m.info.max_model_len] : []));
  if (lens.length === 0) return null;
  const v = validateApiRequest(kind, body, { maxModelLen: Math.max(...lens) });
  const ids = 'ids' in v.prompt ? v.prompt.ids : await encodeText(v.prompt.text);
  const api = tokenizedApiRequest(v, ids, { maxModelLen: Math.max(...lens) });
  const unfit = pools.decode.filter((m) => m.info !== null && !fits(v, ids, m.info.max_model_len));
  // Prefill is asked for one token: it takes prompts shorter than its limit.
  const short = pools.prefill.filter((m) => m.info !== null && ids.length >= m.info.max_model_len);
  if (short.length < pools.prefill.length) unfit.push(...short);
  return { tokenIds: api.promptTokenIds, unfit };
}

function fits(v: ValidatedRequest, ids: number[], maxModelLen: number): boolean {
  try {
    tokenizedApiRequest(v, ids, { maxModelLen });
    return true;
    // catch-ok: only the limit check runs in the try; its HandoffError means this decode would refuse it
  } catch (e) {
    if (!(e instanceof HandoffError)) throw e;
    return false;
  }
}

/** One client request as the legs need it. */
export interface Call {
  path: string;
  body: Body;
  headers: Record<string, string>;
  res: ServerResponse;
  /** The client went away. */
  client: AbortSignal;
}

/** The instance whose failure made an attempt fail in a way another instance may not (dead, draining). */
export interface Failed {
  m: PoolMember | null;
  /** The params of pages prefill holds for this attempt's decode (READ), once prefill answered. */
  held: TransferParams | null;
}
