/**
 * The seed's fix, as a pure function: remove this step's synchronous READ destinations from the
 * zeroing list, because the zeroing is queued on the compute stream behind the previous forward while
 * the NIC writes the pages without waiting for that stream: a zeroing that lands after the READ wipes
 * the KV just received (DESIGN.md §6, vllm-read-path-spec §3.11, §4.5).
 *
 * Gate order (cheapest first): READ mode → some request receives this step → the list is non-empty
 * (a non-empty list already implies needsKvCacheZeroing; null and [] pass through unchanged).
 *
 *   none             never exclude (vLLM before #59164)
 *   mamba-only       exclude the attention groups' destinations only for Mamba hybrids (#59164)
 *   all-read-groups  without Mamba exclude the destinations of every READ group; with Mamba as #59164
 *
 * Safe because a READ fills its destinations with bytes of pages prefill zeroed when it allocated them
 * (whole pages with equal block sizes; token slots otherwise, and the slots of a decode page past the
 * transferred tokens, its clipped tail, are zeroed on the stream once the READ landed: read_consumer.ts)
 * and every READ of a step is awaited before that step's forward. Mamba state slots and the recompute
 * tail are never destinations here, so they stay in the list.
 */
export type ZeroExclusion = 'none' | 'mamba-only' | 'all-read-groups';

export const ZERO_EXCLUSIONS: readonly ZeroExclusion[] = ['none', 'mamba-only', 'all-read-groups'];

export interface ExclusionContext {
  readMode: boolean;
  hasMamba: boolean;
  /** Transfer groups are ordered attention groups first, then Mamba groups. */
  numAttnGroups: number;
}

/**
 * @param destinations per receiving request, its aligned local READ destinations per transfer group
 * @returns the list to zero: the same array object when nothing changes
 */
export function excludeReadDestinations(
  zeroList: number[] | null,
  variant: ZeroExclusion,
  ctx: ExclusionContext,
  destinations: ReadonlyArray<ReadonlyArray<readonly number[]>>,
): number[] | null {
  if (!ctx.readMode) return zeroList;
  if (destinations.length === 0) return zeroList;
  if (zeroList === null || zeroList.length === 0) return zeroList;
  if (variant === 'none') return zeroList;
  if (variant === 'mamba-only' && !ctx.hasMamba) return zeroList;
  const numGroups = ctx.hasMamba ? ctx.numAttnGroups : Infinity;
  const excluded = new Set<number>();
  for (const perGroup of destinations) {
    perGroup.slice(0, numGroups).forEach((ids) => ids.forEach((b) => excluded.add(b)));
  }
  if (excluded.size === 0) return zeroList;
  return zeroList.filter((b) => !excluded.has(b));
}
