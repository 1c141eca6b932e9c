/**
 * kv_transfer_params: the dict that travels client → proxy → prefill → proxy → decode, with vLLM's
 * field names (snake_case on the wire) plus ours (`transfer_id`, `grant`). Validated with zod at the
 * edge: hostile or malformed params become BAD_TRANSFER_PARAMS and nothing is allocated.
 */
import { z } from 'zod';
import { HandoffError } from '../util/errors.ts';
import { describeZodError, preview } from '../util/field_errors.ts';

const blockId = z.number().int().nonnegative();
/** Bounds on remote_block_ids: transfer groups, and page ids per group. */
export const REMOTE_GROUPS_MAX = 64;
export const REMOTE_BLOCK_IDS_MAX = 1 << 16;

export const kvTransferParamsSchema = z
  .object({
    do_remote_decode: z.boolean().optional(),
    do_remote_prefill: z.boolean().optional(),
    remote_engine_id: z.string().min(1).max(256).nullable().optional(),
    /** Per transfer group (legacy: a flat list for one group). */
    remote_block_ids: z
      .union([
        z.array(z.array(blockId).max(REMOTE_BLOCK_IDS_MAX)).max(REMOTE_GROUPS_MAX),
        z.array(blockId).max(REMOTE_BLOCK_IDS_MAX),
      ])
      .nullable()
      .optional(),
    remote_host: z.string().max(256).nullable().optional(),
    remote_port: z.number().int().min(0).max(65535).nullable().optional(),
    remote_handshake_port: z.number().int().min(0).max(65535).nullable().optional(),
    remote_notify_port: z.number().int().min(0).max(65535).nullable().optional(),
    transfer_id: z.string().min(1).max(256).nullable().optional(),
    grant: z
      .string()
      .regex(/^[0-9a-f]{32,128}$/, 'must be 32-128 lowercase hex digits')
      .nullable()
      .optional(),
    grant_expires_ms: z.number().nonnegative().nullable().optional(),
    /** The grant's lifetime when prefill issued it (ms): decode bounds its end on its own clock (read_consumer). */
    grant_ttl_ms: z.number().nonnegative().max(86_400_000).nullable().optional(),
    /** Tokens the prefill side computed (so decode can check the payload covers what it loads). */
    remote_num_tokens: z.number().int().nonnegative().nullable().optional(),
    /** prefill's tokens per page: remote_block_ids are in these units (absent: decode's own block size). */
    remote_block_size: z.number().int().min(1).max(65536).nullable().optional(),
    /** WRITE mode: decode's destination pages and its grant for the producer's WRITEs. */
    write_mode: z.boolean().optional(),
  })
  .passthrough();

export type KVTransferParams = z.infer<typeof kvTransferParamsSchema>;

/** Errors name the field as the client wrote it: `kv_transfer_params.remote_port`. */
export function parseKvTransferParams(raw: unknown): KVTransferParams | null {
  if (raw === undefined || raw === null) return null;
  if (typeof raw === 'object' && !Array.isArray(raw))
    checkRemoteBlockIds((raw as Record<string, unknown>)['remote_block_ids']);
  const r = kvTransferParamsSchema.safeParse(raw);
  if (!r.success) {
    const p = describeZodError(r.error, raw, ['kv_transfer_params']);
    throw new HandoffError('BAD_TRANSFER_PARAMS', p.message, { param: p.param ?? 'kv_transfer_params' });
  }
  return r.data;
}

/**
 * remote_block_ids by hand, before zod: its two accepted shapes (a list per group, or one flat list)
 * make zod's union report "Invalid input" for, say, 100,000 ids; this says which bound or id is wrong.
 */
function checkRemoteBlockIds(v: unknown): void {
  const param = 'kv_transfer_params.remote_block_ids';
  const bad = (at: string, message: string): HandoffError =>
    new HandoffError('BAD_TRANSFER_PARAMS', message, { param: at });
  if (v === undefined || v === null) return;
  if (!Array.isArray(v)) throw bad(param, `${param} must be a list of page ids per transfer group, got ${preview(v)}`);
  const ids = (list: unknown[], at: string): void => {
    if (list.length > REMOTE_BLOCK_IDS_MAX)
      throw bad(at, `${at} has ${list.length} entries; at most ${REMOTE_BLOCK_IDS_MAX}`);
    list.forEach((b, i) => {
      if (typeof b !== 'number' || !Number.isSafeInteger(b) || b < 0)
        throw bad(`${at}[${i}]`, `${at}[${i}] must be a page id (an integer >= 0), got ${preview(b)}`);
    });
  };
  if (!v.some((g) => Array.isArray(g))) return ids(v, param);
  if (v.length > REMOTE_GROUPS_MAX) throw bad(param, `${param} has ${v.length} groups; at most ${REMOTE_GROUPS_MAX}`);
  v.forEach((g, i) => {
    if (!Array.isArray(g))
      throw bad(
        `${param}[${i}]`,
        `${param}[${i}] must be a list of page ids (one list per transfer group), got ${preview(g)}`,
      );
    ids(g, `${param}[${i}]`);
  });
}

/** remote_block_ids as per-group lists (a flat legacy list is one group). */
export function remoteBlockIdsPerGroup(params: KVTransferParams): number[][] | null {
  const ids = params.remote_block_ids;
  if (ids === null || ids === undefined) return null;
  if (ids.length === 0) return [];
  return typeof ids[0] === 'number' ? [ids as number[]] : (ids as number[][]);
}
