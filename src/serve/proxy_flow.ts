/**
 * The request bodies of the P/D flows (plain functions; the proxy sends them). Field names are vLLM's,
 * so a vLLM proxy and ours drive the same servers the same way (reference spec §6.2):
 *
 *   READ   prefill: body + stream=false, max_tokens=1, max_completion_tokens=1,
 *                   kv_transfer_params {do_remote_decode: true, do_remote_prefill: false, transfer_id}
 *          decode:  the ORIGINAL body + prefill's returned kv_transfer_params (do_remote_prefill: true)
 *   WRITE  both at once, one transfer_id; decode also gets prefill's engine id and side channel
 *          (from its GET /handoff/info) so it can tell prefill where to write.
 */
import { HandoffError } from '../util/errors.ts';
import type { InstanceInfo } from './instance_server.ts';

type Body = Record<string, unknown>;

export function prefillBody(body: Body, transferId: string): Body {
  const out: Body = { ...body, stream: false, max_tokens: 1, max_completion_tokens: 1 };
  delete out['stream_options'];
  out['kv_transfer_params'] = { do_remote_decode: true, do_remote_prefill: false, transfer_id: transferId };
  return out;
}

/** READ: decode loads what prefill computed; the params come back from prefill unchanged but for the flags. */
export function decodeBodyRead(body: Body, prefillParams: unknown): Body {
  if (prefillParams === null || typeof prefillParams !== 'object' || Array.isArray(prefillParams)) {
    throw new HandoffError('TRANSFER_FAILED', 'prefill answered without kv_transfer_params');
  }
  return { ...body, kv_transfer_params: { ...(prefillParams as Body), do_remote_prefill: true, do_remote_decode: false } };
}

export function decodeBodyWrite(body: Body, prefill: InstanceInfo | null, transferId: string): Body {
  if (prefill?.engine_id == null || prefill.side_channel_host == null || prefill.side_channel_port == null) {
    throw new HandoffError('PEER_UNAVAILABLE', 'the prefill instance has not published its engine id and side channel (/handoff/info)');
  }
  if (prefill.transfer_mode !== 'write') {
    throw new HandoffError('PEER_INCOMPATIBLE', `the prefill instance runs in ${String(prefill.transfer_mode)} mode; the proxy is in WRITE mode`);
  }
  return {
    ...body,
    kv_transfer_params: {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_engine_id: prefill.engine_id,
      remote_host: prefill.side_channel_host,
      remote_port: prefill.side_channel_port,
      transfer_id: transferId,
    },
  };
}
