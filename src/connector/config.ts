/**
 * kv_transfer_config, the way vLLM takes it (`--kv-transfer-config '<json>'`):
 *   {"kv_connector": "OneSidedConnector", "kv_role": "kv_producer" | "kv_consumer" | "kv_both",
 *    "kv_connector_extra_config": {"read_mode": true, "zero_exclusion": "all-read-groups",
 *                                  "sync_before_read": false, "async_read": true, "lease_ms": 60000,
 *                                  "transfer_timeout_ms": 30000}}
 * read_mode accepts true/false or the strings "true"/"1" like MoRIIO; the default is READ. async_read: a READ
 * load does not hold decode's step; the request waits in WAITING_FOR_REMOTE_KVS while the batch goes on. It is
 * the default in READ mode, as vLLM's NIXL connector loads (since session 20); "async_read": false makes the
 * step that admits a request await its READ.
 */
import { z } from 'zod';
import { HandoffError } from '../util/errors.ts';
import { ZERO_EXCLUSIONS, type ZeroExclusion } from './zero_exclusion.ts';
import type { MutantName } from '../util/mutants.ts';

export interface OneSidedConfig {
  role: 'producer' | 'consumer' | 'both';
  mode: 'read' | 'write';
  zeroExclusion: ZeroExclusion;
  syncBeforeRead: boolean;
  /**
   * READ mode: loads are asynchronous, as vLLM's NIXL connector does them. The request waits in
   * WAITING_FOR_REMOTE_KVS while its READ is in flight, and the step does not wait for it; its first
   * forward runs in a step after the READ landed. False: the step that admits it awaits its READ.
   */
  asyncRead: boolean;
  /** Producer: held pages are freed when no release arrives within this lease. */
  leaseMs: number;
  /** Consumer: a step's READs must finish within this. */
  transferTimeoutMs: number;
  /** Test-only fault switch forwarded to the transfer engine. */
  faults?: { readErrorRate?: number; readDelayMs?: number; dropNotificationRate?: number };
  /**
   * Simulator only (its split-transfer fault): ranges one work request carries at most, below the
   * transport's DESCRIPTORS_MAX, so a short prompt's READ or WRITE goes as several work requests.
   */
  rangesPerWorkRequest?: number;
  /** Bug zoo only (src/util/mutants.ts). */
  mutant?: MutantName;
}

/**
 * async_read: async READs in flight at most (loading, or aborted and not yet acknowledged by the NIC). Each
 * holds an entry of the worker's READ table (READS_MAX, an assertion beyond) for as long as it is in flight,
 * and parked requests take no token budget or running slot: past this, a load waits in the queue. Well under
 * READS_MAX: the same table takes each step's synchronous READs.
 */
export const ASYNC_READS_MAX = 1024;

/**
 * The in-process default (tests, the A/B, the simulator's worlds, which say which loads they run). Serving's
 * kv_transfer_config defaults to async READ loads (parseKvTransferConfig).
 */
export const DEFAULT_ONE_SIDED_CONFIG: OneSidedConfig = {
  role: 'both',
  mode: 'read',
  zeroExclusion: 'all-read-groups',
  syncBeforeRead: false,
  asyncRead: false,
  leaseMs: 60_000,
  transferTimeoutMs: 30_000,
};

const boolish = z
  .union([z.boolean(), z.enum(['true', 'false', '1', '0'])])
  .transform((v) => v === true || v === 'true' || v === '1');

const schema = z
  .object({
    kv_connector: z.enum(['OneSidedConnector', 'NullConnector']).default('OneSidedConnector'),
    kv_role: z.enum(['kv_producer', 'kv_consumer', 'kv_both']),
    kv_connector_extra_config: z
      .object({
        read_mode: boolish.optional(),
        zero_exclusion: z.enum(ZERO_EXCLUSIONS as [ZeroExclusion, ...ZeroExclusion[]]).optional(),
        sync_before_read: boolish.optional(),
        async_read: boolish.optional(),
        lease_ms: z.number().int().min(10).max(3_600_000).optional(),
        transfer_timeout_ms: z.number().int().min(10).max(3_600_000).optional(),
        faults: z
          .object({
            read_error_rate: z.number().min(0).max(1).optional(),
            read_delay_ms: z.number().min(0).max(60_000).optional(),
            drop_notification_rate: z.number().min(0).max(1).optional(),
          })
          .strict()
          .optional(),
      })
      .strict()
      .default({}),
  })
  .strict();

export interface ParsedTransferConfig {
  connector: 'OneSidedConnector' | 'NullConnector';
  config: OneSidedConfig;
}

export function parseKvTransferConfig(raw: unknown): ParsedTransferConfig {
  let value = raw;
  if (typeof raw === 'string') {
    try {
      value = JSON.parse(raw);
    } catch (e) {
      if (!(e instanceof SyntaxError)) throw e;
      throw new HandoffError('BAD_CONFIG', `--kv-transfer-config is not valid JSON: ${(e as Error).message}`);
    }
  }
  const r = schema.safeParse(value);
  if (!r.success) {
    const issue = r.error.issues[0];
    throw new HandoffError(
      'BAD_CONFIG',
      `invalid kv_transfer_config at ${issue?.path.join('.') || '(root)'}: ${issue?.message ?? 'bad value'}`,
    );
  }
  const x = r.data.kv_connector_extra_config;
  const role = r.data.kv_role === 'kv_producer' ? 'producer' : r.data.kv_role === 'kv_consumer' ? 'consumer' : 'both';
  const faults = x.faults
    ? {
        readErrorRate: x.faults.read_error_rate,
        readDelayMs: x.faults.read_delay_ms,
        dropNotificationRate: x.faults.drop_notification_rate,
      }
    : undefined;
  return {
    connector: r.data.kv_connector,
    config: {
      role,
      mode: x.read_mode === false ? 'write' : 'read',
      zeroExclusion: x.zero_exclusion ?? DEFAULT_ONE_SIDED_CONFIG.zeroExclusion,
      syncBeforeRead: x.sync_before_read ?? false,
      asyncRead: x.async_read ?? x.read_mode !== false,
      leaseMs: x.lease_ms ?? DEFAULT_ONE_SIDED_CONFIG.leaseMs,
      transferTimeoutMs: x.transfer_timeout_ms ?? DEFAULT_ONE_SIDED_CONFIG.transferTimeoutMs,
      ...(faults ? { faults } : {}),
    },
  };
}
