/**
 * kv_transfer_params: the dict that travels client → proxy → prefill → proxy → decode, with vLLM's
 * field names (snake_case on the wire) plus ours (`transfer_id`, `grant`). Validated with zod at the
 * edge: hostile or malformed params become BAD_TRANSFER_PARAMS and nothing is allocated.
 */
import { z } from 'zod';
import { HandoffError } from '../util/errors.ts';

const blockId = z.number().int().nonnegative();

export const kvTransferParamsSchema = z
  .object({
    do_remote_decode: z.boolean().optional(),
    do_remote_prefill: z.boolean().optional(),
    remote_engine_id: z.string().min(1).max(256).nullable().optional(),
    /** Per transfer group (legacy: a flat list for one group). */
    remote_block_ids: z
      .union([z.array(z.array(blockId).max(1 << 16)).max(64), z.array(blockId).max(1 << 16)])
      .nullable()
      .optional(),
    remote_host: z.string().max(256).nullable().optional(),
    remote_port: z.number().int().min(0).max(65535).nullable().optional(),
    remote_handshake_port: z.number().int().min(0).max(65535).nullable().optional(),
    remote_notify_port: z.number().int().min(0).max(65535).nullable().optional(),
    transfer_id: z.string().min(1).max(256).nullable().optional(),
    grant: z.string().regex(/^[0-9a-f]{32,128}$/, 'grant must be hex').nullable().optional(),
    grant_expires_ms: z.number().nonnegative().nullable().optional(),
    /** Tokens the prefill side computed (so decode can check the payload covers what it loads). */
    remote_num_tokens: z.number().int().nonnegative().nullable().optional(),
    /** WRITE mode: decode's destination pages and its grant for the producer's WRITEs. */
    write_mode: z.boolean().optional(),
  })
  .passthrough();

export type KVTransferParams = z.infer<typeof kvTransferParamsSchema>;

export function parseKvTransferParams(raw: unknown): KVTransferParams | null {
  if (raw === undefined || raw === null) return null;
  const r = kvTransferParamsSchema.safeParse(raw);
  if (!r.success) {
    const issue = r.error.issues[0];
    const where = issue ? issue.path.join('.') : '';
    throw new HandoffError('BAD_TRANSFER_PARAMS', `invalid kv_transfer_params${where ? ` at ${where}` : ''}: ${issue?.message ?? 'bad value'}`);
  }
  return r.data;
}

/** remote_block_ids as per-group lists (a flat legacy list is one group). */
export function remoteBlockIdsPerGroup(params: KVTransferParams): number[][] | null {
  const ids = params.remote_block_ids;
  if (ids === null || ids === undefined) return null;
  if (ids.length === 0) return [];
  return typeof ids[0] === 'number' ? [ids as number[]] : (ids as number[][]);
}
