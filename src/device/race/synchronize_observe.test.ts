/**
 * SimDevice.synchronize() joins each stream's event into the host when Promise.all's internal
 * continuation runs (the moment the event is reached), not when host code continues after
 * `await synchronize()`. Host code of another flow running in between is ordered behind the stream.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createSimDevice } from '../sim.ts';
import { RaceChecker } from './race_checker.ts';

test('an unconsumed synchronize() does not order a NIC write behind the zeroing', async () => {
  const d = createSimDevice({ numSlabs: 1, numBlocks: 4, pageBytes: 64, raceCheck: true });
  const rc = d.raceChecker as RaceChecker;
  d.compute.enqueue({ op: { kind: 'zero', blockIds: [1], slabs: [0] }, label: { what: 'zero' } });
  const sync = d.synchronize(); // flow A (consumed below)
  d.runAll(); // the zeroing runs, the event is reached
  for (let i = 0; i < 5; i++) await Promise.resolve(); // unrelated microtasks
  // Flow B posts a READ into the page without having waited for anything.
  rc.nicPost({ what: 'kv-read' }, [{ slab: 0, block: 1, start: 0, end: 64, write: true }]);
  await sync;
  assert.equal(rc.races().length, 1, 'zero vs kv-read must be reported');
});
