/**
 * The pass/fail verdict of `handoff ab`, so it can gate CI and scripts. The variants that carry the fix
 * (zero exclusion of `all-read-groups`, with or without syncBeforeRead) must match the colocated
 * reference on every request with no race, and every request must have loaded its KV from prefill (a
 * READ that failed and was recomputed locally would match too, and hide a broken transfer); any mismatch
 * (a failed request counts as one), race or load failure in one of them fails the A/B (exit 1). The buggy
 * variants (`none`, `mamba-only`) are expected to corrupt and never fail it: that contrast is what the A/B
 * shows. With only buggy variants chosen nothing gates.
 */
import type { ZeroExclusion } from '../connector/zero_exclusion.ts';

/** The zero exclusion every gating variant uses. */
export const FIX_ZERO_EXCLUSION: ZeroExclusion = 'all-read-groups';

export interface AbGateInput {
  name: string;
  zeroExclusion: ZeroExclusion;
  mismatchedRequests: number;
  races: number;
  /** Requests that recomputed after a failed READ (absent: not counted). */
  loadFailures?: number;
}

export interface AbVerdict {
  ok: boolean;
  /** The variants whose result decides the verdict, in run order. */
  gating: string[];
  /** One line per failing gating variant. */
  failures: string[];
  /** One line for people: what gated and why it passed or failed. */
  summary: string;
}

export function abVerdict(results: readonly AbGateInput[]): AbVerdict {
  const gates = results.filter((r) => r.zeroExclusion === FIX_ZERO_EXCLUSION);
  const gating = gates.map((r) => r.name);
  const failures = gates
    .filter((r) => r.mismatchedRequests > 0 || r.races > 0 || (r.loadFailures ?? 0) > 0)
    .map(
      (r) =>
        `${r.name}: ${r.mismatchedRequests} mismatched request(s), ${r.races} race(s)` +
        ((r.loadFailures ?? 0) > 0 ? `, ${r.loadFailures} load failure(s) recomputed locally` : ''),
    );
  if (gating.length === 0) {
    return {
      ok: true,
      gating,
      failures,
      summary: `gate: none (no variant with the ${FIX_ZERO_EXCLUSION} fix was run; buggy variants never fail the A/B)`,
    };
  }
  if (failures.length > 0)
    return { ok: false, gating, failures, summary: `gate: FAIL, the fix does not hold: ${failures.join('; ')}` };
  return {
    ok: true,
    gating,
    failures,
    summary: `gate: pass (${gating.join(', ')}: every request matched the reference, no race)`,
  };
}
