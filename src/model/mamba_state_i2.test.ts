/**
 * Review (kv): the page lifecycle oracle's I2 check of a recurrent (Mamba) state read must be able to
 * fail on the real hybrid geometry. In hybrid-mini every group's layer j lives in slab j, so the Mamba
 * state pages sit on ATTENTION slabs (0 and 1). The oracle told a state read from an attention read by
 * its slab ("not an attention slab"), so on hybrid-mini a forward resuming from a state page that was
 * never written nor landed (stale bytes of its previous owner) was judged after its own whole-state
 * write, and the stale read was never reported: an oracle that cannot fail. The forward's footprint now
 * marks its state reads (`state: true`), and the oracle judges those before the forward's writes.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { PageLifecycle, type LifecycleViolation } from '../kv/page_lifecycle.ts';
import { attentionSlabs } from '../kv/spec.ts';
import { forwardFootprint } from './footprint.ts';
import { kvConfigFor, request } from './fixtures.ts';

function setup(): { lc: PageLifecycle; seen: LifecycleViolation[] } {
  const kv = kvConfigFor('hybrid-mini');
  // The premise: the Mamba group's slabs are attention slabs too (shared slabs, layer j in slab j).
  assert.deepEqual(attentionSlabs(kv), [0, 1]);
  const seen: LifecycleViolation[] = [];
  const lc = new PageLifecycle('D', kv.numBlocks, kv.pageBytes, kv.needsKvCacheZeroing, attentionSlabs(kv), (v) =>
    seen.push(v),
  );
  return { lc, seen };
}

const kv = kvConfigFor('hybrid-mini');

test('I2 on hybrid-mini: a forward resuming from a Mamba state page never written nor landed is reported', () => {
  const { lc, seen } = setup();
  lc.allocated([1, 7], true); // attention page 1, Mamba state page 7: both stale bytes of a previous owner
  lc.zeroEnqueued(1, [1], attentionSlabs(kv));
  lc.zeroRan(1);
  // Resuming at position 2 (e.g. a load that never brought the state): the stale state is read.
  lc.forwardEnqueued(2, forwardFootprint(kv, { step: 0, requests: [request('r', [8], 2, [[1], [7]])] }));
  assert.deepEqual(
    [...new Set(seen.map((v) => `${v.invariant}:${v.block}`))],
    ['I2:7'],
    seen.map((v) => v.message).join('\n'),
  );
});

test('nearest legal: the first forward writes the state (no read), the next one resumes from it', () => {
  const { lc, seen } = setup();
  lc.allocated([1, 7], true);
  lc.zeroEnqueued(1, [1], attentionSlabs(kv));
  lc.zeroRan(1);
  lc.forwardEnqueued(2, forwardFootprint(kv, { step: 0, requests: [request('r', [5, 6], 0, [[1], [7]])] }));
  lc.forwardRan(2);
  lc.forwardEnqueued(3, forwardFootprint(kv, { step: 1, requests: [request('r', [8], 2, [[1], [7]])] }));
  lc.forwardRan(3);
  assert.deepEqual(seen, []);
});
