/**
 * Alignment between decode's and prefill's page lists of one transfer group, in token space (the two
 * sides' block sizes may differ, issue 14). Both lists start at the request's token 0: local page i holds
 * tokens [i * localBlockSize, ...), remote page j tokens [j * remoteBlockSize, ...).
 *
 *   coverage end = min(local pages, remote pages) in tokens: the transfer moves tokens [start, end)
 *   start        = decode's local prefix hit (its pages are shared, cached and already right)
 *   local tail   = decode pages wholly past the end: the recompute tail (last prompt token, lookahead)
 *                  that prefill never had; it stays in the zero list, at most `maxTail` pages
 *   clipped tail = the slots of the last destination page past the end (a decode page larger than the
 *                  remote pages it receives): zeroed after the transfer lands (token_map.ts tailSpans)
 *
 *   local  (bs 32):  | L0: t0-31            | L1: t32-63 (tail) |
 *   remote (bs 8):   | R0 | R1 | R2 |                               end = min(64, 24) = 24: L0 <- R0..R2,
 *                                                                 L0's slots 24-31 clipped, L1 recomputed
 *
 * With equal block sizes this is page i <- remote page i, whole pages, as before.
 */
import { HandoffError } from '../util/errors.ts';

export interface TokenAlignment {
  /** Destination pages (local pages holding tokens of [start, end)), in token order. */
  local: number[];
  /** Source pages (remote pages holding tokens of [start, end)), in token order. */
  remote: number[];
  /** Tokens moved: [start, end); start == end when nothing moves. */
  start: number;
  end: number;
}

export function cdiv(a: number, b: number): number {
  return Math.ceil(a / b);
}

export const NOTHING_TO_MOVE: Readonly<TokenAlignment> = Object.freeze({ local: [], remote: [], start: 0, end: 0 });

/**
 * Pages and tokens of one attention group's transfer. Throws BAD_TRANSFER_PARAMS when decode holds more
 * pages past prefill's coverage than its recompute tail allows.
 */
export function alignTokens(
  local: { blockIds: readonly number[]; blockSize: number },
  remote: { blockIds: readonly number[]; blockSize: number },
  startToken: number,
  maxTail: number,
): TokenAlignment {
  const end = Math.min(local.blockIds.length * local.blockSize, remote.blockIds.length * remote.blockSize);
  const localPages = cdiv(end, local.blockSize);
  const excess = local.blockIds.length - localPages;
  if (excess > maxTail) {
    throw new HandoffError(
      'BAD_TRANSFER_PARAMS',
      `decode block ids exceed prefill block ids beyond the allowed local tail (${local.blockIds.length} local pages of ${local.blockSize} tokens, ${remote.blockIds.length} remote of ${remote.blockSize}, allowed tail ${maxTail})`,
    );
  }
  return tokenRun(local, remote, startToken, end);
}

/** The pages of both sides (lists from token 0) holding tokens [start, end); nothing when start >= end. */
export function tokenRun(
  local: { blockIds: readonly number[]; blockSize: number },
  remote: { blockIds: readonly number[]; blockSize: number },
  start: number,
  end: number,
): TokenAlignment {
  if (start >= end) return { ...NOTHING_TO_MOVE, local: [], remote: [] };
  return {
    local: local.blockIds.slice(Math.floor(start / local.blockSize), cdiv(end, local.blockSize)),
    remote: remote.blockIds.slice(Math.floor(start / remote.blockSize), cdiv(end, remote.blockSize)),
    start,
    end,
  };
}

/** A state group (Mamba): the running state page moves whole when both sides have one, else nothing. */
export function alignState(local: readonly number[], remote: readonly number[]): TokenAlignment {
  if (local.length > 1 || remote.length > 1)
    throw new HandoffError('BAD_TRANSFER_PARAMS', 'a Mamba group moves one state page per request');
  const [l, r] = [local[0], remote[0]];
  if (l === undefined || r === undefined) return { ...NOTHING_TO_MOVE, local: [], remote: [] };
  return { local: [l], remote: [r], start: 0, end: 0 };
}
