/**
 * Block alignment between decode's (local) and prefill's (remote) page lists, per group.
 *
 *   local longer:  decode allocated a recompute tail (last prompt token, lookahead) that prefill never
 *                  had; drop it from the READ (it stays in the zero list), at most `maxTail` pages.
 *   local shorter: a local prefix hit already covers the head; pair local with the remote suffix.
 *   equal:         page i receives remote page i, byte for byte.
 */
import { HandoffError } from '../util/errors.ts';

export interface AlignedBlocks {
  local: number[];
  remote: number[];
}

export function alignReadBlocks(local: readonly number[], remote: readonly number[], maxTail: number): AlignedBlocks {
  if (local.length > remote.length) {
    const excess = local.length - remote.length;
    if (excess > maxTail) {
      throw new HandoffError(
        'BAD_TRANSFER_PARAMS',
        `decode block ids exceed prefill block ids beyond the allowed local tail (${local.length} local, ${remote.length} remote, allowed tail ${maxTail})`,
      );
    }
    return { local: local.slice(0, remote.length), remote: [...remote] };
  }
  if (local.length < remote.length) {
    return { local: [...local], remote: local.length === 0 ? [] : remote.slice(remote.length - local.length) };
  }
  return { local: [...local], remote: [...remote] };
}

export function cdiv(a: number, b: number): number {
  return Math.ceil(a / b);
}
