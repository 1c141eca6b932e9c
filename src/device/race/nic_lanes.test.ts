/**
 * The race checker's bound on NIC work requests unobserved at once (its NIC lanes) was 4,096, far below
 * the 65,536 work-request clocks it keeps. The simulator's split-transfer fault posts every READ as work
 * requests of 1-3 ranges; with one token per prefill page at TP 2 a step's READs are thousands of them
 * (`sim --scenario chunked-prefill --strategy random --seed 9503 --model hybrid-micro --requests 6
 * --prefill-block-size 1 --decode-block-size 8 --prefill-tp 2 --decode-tp 2 --replay`: between 4,000 and
 * 5,000). The checker's assertion then threw inside the decode engine's READ posting, and the sim
 * reported a correct run as `[crash] D: engine loop crashed: race checker: more than 4096 NIC requests
 * unobserved` plus a liveness failure. With the bound raised (the same seed peaks under 5,000) it passes
 * every oracle.
 *
 * Proves: with default options the checker follows 5,000 unobserved work requests (and still judges them:
 * a forward reading a page before its READ was observed races, after it does not), and the bound is still
 * enforced where it is set.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { RaceChecker } from './race_checker.ts';
import type { PageAccess } from '../types.ts';

const PAGE = 64;
const w = (block: number): PageAccess => ({ slab: 0, block, start: 0, end: PAGE, write: true });
const r = (block: number): PageAccess => ({ slab: 0, block, start: 0, end: PAGE, write: false });

test('5,000 NIC work requests unobserved at once (one step of split READs) are followed, not an assertion', () => {
  const c = new RaceChecker();
  c.addStream('compute');
  const n = 5000;
  const ids: number[] = [];
  for (let i = 0; i < n; i++) ids.push(c.nicPost({ what: `READ wr ${i}` }, [w(1 + i)]));
  c.hostEnqueue('compute', { what: 'forward too early' }, [r(1)]);
  assert.equal(c.races().length, 1, 'the forward races with the unobserved work request into page 1');
  for (const id of ids) c.nicObserved(id);
  c.hostEnqueue('compute', { what: 'forward' }, [r(2)]);
  assert.equal(c.races().length, 1, 'once observed, no new race');
  assert.ok(c.stats().nicLanes <= n, `NIC lanes ${c.stats().nicLanes}`);
});

test('the bound on unobserved NIC work requests is still enforced when set', () => {
  const c = new RaceChecker({ nicLanesMax: 3 });
  for (let i = 0; i < 3; i++) c.nicPost({ what: `READ ${i}` }, [w(1 + i)]);
  assert.throws(() => c.nicPost({ what: 'READ 3' }, [w(4)]), /more than 3 NIC requests unobserved/);
});
