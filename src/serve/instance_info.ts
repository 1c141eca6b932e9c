/**
 * GET /handoff/info as the proxy reads it: input from the network, validated before the pool keeps it.
 * The router hashes prompts with the instance's block size and prefix-cache groups, so a value out of
 * range there would reach the block hasher's assertions; an instance that announces such an info is
 * not routed to at all (the health check marks it down, naming the field).
 */
import { z } from 'zod';
import { HandoffError } from '../util/errors.ts';
import { describeZodError } from '../util/field_errors.ts';
import { parseJsonText } from './http_io.ts';
import { isBlockSize } from '../kv/presets.ts';
import type { InstanceInfo } from './instance_server.ts';

/** Prefix-cache groups an instance may announce (our presets have at most 2 attention groups). */
const PREFIX_GROUPS_MAX = 64;
const text = z.string().max(256);
const port = z.number().int().min(0).max(65_535);

const INFO = z.object({
  engine_id: text.nullable(),
  role: z.enum(['prefill', 'decode', 'both']),
  model: text,
  preset: text,
  kv_role: z.enum(['kv_producer', 'kv_consumer', 'kv_both']).nullable(),
  transfer_mode: z.enum(['read', 'write']).nullable(),
  side_channel_host: text.nullable(),
  side_channel_port: port.nullable(),
  data_port: port.nullable(),
  max_model_len: z.number().int().positive(),
  num_pages: z.number().int().nonnegative(),
  block_size: z.number().refine(isBlockSize, 'a power of two in [1, 256]'),
  prefix_cache_groups: z.array(z.number().int().min(0).max(0xffff_ffff)).max(PREFIX_GROUPS_MAX),
  kv_events_epoch: z.string().min(1).max(128),
  compat_hash: text.nullable().optional(),
});

/** The info from its body text, or BAD_REQUEST naming the first field that is wrong. */
export function parseInstanceInfo(body: string): InstanceInfo {
  const json = parseJsonText(body, () => new HandoffError('BAD_REQUEST', 'its /handoff/info is not JSON'));
  if (json === null || typeof json !== 'object' || Array.isArray(json))
    throw new HandoffError('BAD_REQUEST', 'its /handoff/info is not a JSON object');
  const r = INFO.safeParse(json);
  if (r.success) return r.data;
  const p = describeZodError(r.error, json);
  throw new HandoffError('BAD_REQUEST', `its /handoff/info is malformed: ${p.message}`);
}
