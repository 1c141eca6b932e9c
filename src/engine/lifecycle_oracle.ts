/**
 * The page lifecycle oracle on a running engine (`handoff serve --race-check`): a PageLifecycle fed
 * by the engine's block pool and compute stream observers, as in the simulator. Violations go to
 * `onViolation` (the server logs them and counts `handoff_lifecycle_violations_total`); serving goes on.
 *
 * Transfers and grants are not observed here (the simulator feeds those from its fabric), so a page
 * filled by a READ or WRITE would look stale to I2: I2 is checked only on an engine without a
 * connector. What runs everywhere: I4 (forward touching a freed page, write landing after a free,
 * double allocation), I6 (zeroing of pages the engine does not own, or of other slabs than the
 * attention slabs) and I1's stale zero landing on a page's next owner.
 */
import type { LLMEngine } from './llm_engine.ts';
import { PageLifecycle, type LifecycleViolation } from '../kv/page_lifecycle.ts';
import { watchPool, watchStream } from '../kv/lifecycle_watch.ts';
import { attentionSlabs } from '../kv/spec.ts';

export interface LifecycleOracle {
  readonly lifecycle: PageLifecycle;
  /** Violations reported since attach. */
  violations(): number;
  /** Stop observing (idempotent). */
  detach(): void;
}

/** Attach before the first request: pages and ops already in flight would be unknown to the oracle. */
export function attachLifecycleOracle(
  engine: Pick<LLMEngine, 'kv' | 'kvConfig' | 'device' | 'connector'>,
  name: string,
  onViolation: (v: LifecycleViolation) => void,
): LifecycleOracle {
  const kv = engine.kvConfig;
  let count = 0;
  const checkI2 = kv.needsKvCacheZeroing && engine.connector === null;
  const lifecycle = new PageLifecycle(name, kv.numBlocks, kv.pageBytes, checkI2, attentionSlabs(kv), (v) => {
    count++;
    onViolation(v);
  });
  const stops = [
    watchStream(lifecycle, engine.device.compute, kv.pageBytes),
    watchPool(lifecycle, engine.kv.blockPool),
  ];
  return {
    lifecycle,
    violations: () => count,
    detach: () => {
      for (const stop of stops.splice(0)) stop();
    },
  };
}
