/**
 * End-of-run oracles, judged once the world has stopped (the race checker and the page lifecycle
 * judge during the run):
 *   liveness             every request finished; a failure carries a typed error code (never
 *                        untyped, never INTERNAL = a crash); without any injected fault (harmless ones
 *                        aside: HARMLESS_FAULTS) or scenario action, every request succeeds and no load
 *                        fails (none recomputed locally after its transfer's timeout: a WRITE prefill
 *                        never pushed, a READ that never came, hid behind the recompute fallback)
 *   pd-equals-colocated  every successful request equals the colocated run of it alone, token for
 *                        token and logits hash for logits hash, with no NaN logits
 *   leak                 both live instances are quiescent with every page back in the pool and every
 *                        NIC completion-queue slot free (a slot lost per failed work request ends in
 *                        OVERLOADED for every transfer)
 *   lease, cancel        held prefill pages and cancellations (cancel_oracles.ts)
 *   router-index         xpyd: the router's index equals the pools after the last heartbeats (xpyd.ts)
 */
import type { FaultSite } from './buggify.ts';
import { colocatedReference } from './reference.ts';
import type { SimWorld } from './world.ts';

/**
 * Faults that may slow a request down but never fail it nor its load: a zeroing held back a few steps, a
 * notification delivered twice (idempotent), decode pages taken (preemption: recomputed, no load fails).
 * A run where only these fired is judged as undisturbed: a load failure there is a bug (a run with any
 * fault fired was exempt, 36 of 1p1d's seeds 1-40, so a READ refused on every prompt whose N-1 tokens end
 * on a page boundary was caught in 10 of 1280 schedules of `sim --scenario all`).
 */
const HARMLESS_FAULTS: ReadonlySet<FaultSite> = new Set<FaultSite>(['delay-zero', 'dup-notify', 'preempt']);

export async function judgeEnd(w: SimWorld): Promise<void> {
  if (w.violations.length > 0) return;
  const disturbed =
    Object.keys(w.buggify.fired).some((site) => !HARMLESS_FAULTS.has(site as FaultSite)) ||
    w.scenario.abortTarget !== null ||
    w.scenario.killPrefillMidRead ||
    w.cancels.applied.length > 0;
  w.cancelOracles.judgeEnd();
  w.xpyd?.judgeEnd();
  for (const r of w.proxy.requests) {
    const o = r.outcome;
    if (o === null) {
      w.violate('liveness', `request ${r.spec.index} never finished (phase ${r.phase})`);
      continue;
    }
    if (o.ok) continue;
    if (o.errorCode === null)
      w.violate('liveness', `request ${r.spec.index} failed with an untyped error: ${o.errorMessage}`);
    else if (o.errorCode === 'INTERNAL')
      w.violate('crash', `request ${r.spec.index} failed with INTERNAL: ${o.errorMessage}`);
    else if (!disturbed)
      w.violate(
        'liveness',
        `request ${r.spec.index} failed (${o.errorCode}: ${o.errorMessage}) although no fault was injected`,
      );
  }

  if (!disturbed) judgeUndisturbedLoads(w);

  const refs = colocatedReference(
    w.scenario.preset,
    w.scenario.modelSeed,
    w.proxy.requests.map((r) => r.spec),
  );
  w.proxy.requests.forEach((r, i) => {
    const o = r.outcome;
    const ref = refs[i];
    if (o === null || !o.ok || ref === undefined) return;
    if (o.nanLogits) w.violate('pd-equals-colocated', `request ${i}: NaN logits (stale or wiped KV)`);
    const at = ref.tokenIds.findIndex((t, k) => t !== o.tokenIds[k] || ref.logitsHashes[k] !== o.logitsHashes[k]);
    if (at >= 0 || o.tokenIds.length !== ref.tokenIds.length) {
      const k = at >= 0 ? at : Math.min(o.tokenIds.length, ref.tokenIds.length);
      w.violate(
        'pd-equals-colocated',
        `request ${i}: P/D output differs from colocated at token ${k} (P/D ${o.tokenIds.join(',')} vs colocated ${ref.tokenIds.join(',')}; ${o.numExternalTokens} tokens came from prefill)`,
      );
    }
  });

  for (const inst of w.instances) {
    if (!inst.alive) continue;
    const free = inst.engine.kv.getNumFreeBlocks();
    const total = inst.kvConfig.numBlocks - 1;
    if (free !== total)
      w.violate(
        'leak',
        `${inst.name}: ${total - free} of ${total} pages not back in the pool (lifecycle: ${inst.lifecycle.allocatedCount()} allocated)`,
      );
    const slots = inst.transfer.nicSlotsTaken;
    if (slots !== 0) w.violate('leak', `${inst.name}: ${slots} NIC completion-queue slots still taken at the end`);
    if (!inst.engine.scheduler.isQuiescent())
      w.violate(
        'leak',
        `${inst.name}: scheduler not quiescent at the end (requests, held pages or pending frees remain)`,
      );
  }
}

/** Without a fault or scenario action every load lands: one recomputed after its timeout hid a lost handoff. */
function judgeUndisturbedLoads(w: SimWorld): void {
  for (const inst of w.instances) {
    const failures = inst.engine.scheduler.stats.loadFailures;
    if (failures > 0)
      w.violate(
        'liveness',
        `${inst.name}: ${failures} KV load(s) failed (recomputed locally) although no fault was injected`,
      );
  }
}
