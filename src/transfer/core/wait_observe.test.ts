/**
 * TransferEngine.wait() and abort() must tell the race checker "the host observed the READ" when host
 * code continues because of them, not when the NIC completes (or at the call, when already done): host
 * code that never consumed the wait (another flow, or the same flow before its await) would be ordered
 * behind the READ only by the timing of this run, and a real race would go unreported.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimEnv } from '../../util/env.ts';
import { LAYOUT, pageRanges } from '../testing/conformance_support.ts';
import { SimFabric } from '../sim/sim_fabric.ts';
import { SimTransferEngine } from '../sim/sim.ts';
import { RaceChecker } from '../../device/race/race_checker.ts';
import type { PageAccess } from '../../device/types.ts';

async function pair() {
  const env = new SimEnv(7);
  const fabric = new SimFabric(false);
  const mk = (engineId: string, fill: number) =>
    new SimTransferEngine({
      env,
      fabric,
      engineId,
      modelName: 'tiny',
      preset: 'dsv4-mini',
      layout: LAYOUT,
      blockSizes: [16, 16],
      slabViews: Array.from({ length: LAYOUT.numSlabs }, () =>
        new Uint8Array(LAYOUT.numBlocks * LAYOUT.pageBytes).fill(fill),
      ),
      notifyTimeoutMs: 50,
    });
  const P = mk('P', 7);
  const D = mk('D', 0);
  const hs = D.handshake(P.address());
  await Promise.resolve();
  fabric.run(fabric.queued()[0]!.id);
  await hs;
  return { fabric, P, D };
}

const page5: PageAccess = { slab: 0, block: 5, start: 0, end: LAYOUT.pageBytes, write: true };

async function setup() {
  const { fabric, P, D } = await pair();
  const rc = new RaceChecker();
  rc.addStream('compute');
  D.attachRaceChecker(rc);
  const g = P.issueGrant({ transferId: 't', peerEngineId: 'D', blockIds: [3], ttlMs: 1000 });
  const h = D.postRead({
    peerEngineId: 'P',
    transferId: 't',
    grantToken: g.token,
    ranges: pageRanges([[3, 5]]),
    label: { what: 'kv-read' },
    footprint: [page5],
  });
  return { fabric, D, rc, h };
}

test('a pending wait() that no host code has consumed yet does not order a zeroing behind the READ', async () => {
  const { fabric, D, rc, h } = await setup();
  const waiting = D.wait([h], 100); // flow A waits (consumed below, after the zeroing)
  fabric.run(fabric.queued()[0]!.id); // the READ lands
  // Flow B, which never waited for the READ, zeroes the page: nothing orders it after the READ.
  rc.hostEnqueue('compute', { what: 'zero' }, [page5]);
  await waiting;
  assert.equal(rc.races().length, 1, 'zero vs kv-read must be reported');
});

test('wait() on a READ already landed does not order host code that runs before the wait is consumed', async () => {
  const { fabric, D, rc, h } = await setup();
  fabric.run(fabric.queued()[0]!.id); // the READ lands, nobody looks
  const waiting = D.wait([h], 100);
  rc.hostEnqueue('compute', { what: 'zero' }, [page5]); // before the host continues after the wait
  await waiting;
  assert.equal(rc.races().length, 1, 'zero vs kv-read must be reported');
});

test('control: host code after the awaited wait() is ordered behind the READ', async () => {
  const { fabric, D, rc, h } = await setup();
  const waiting = D.wait([h], 100);
  fabric.run(fabric.queued()[0]!.id);
  await waiting;
  rc.hostEnqueue('compute', { what: 'forward' }, [page5]);
  assert.deepEqual(rc.races(), []);
});

/** The simulated NIC answers an abort when its fabric item runs (the READ could still land before it). */
function runAbort(fabric: SimFabric): void {
  const item = fabric.queued().find((i) => i.label.what === 'nic-abort');
  assert.ok(item !== undefined, 'the abort is a fabric item');
  fabric.run(item.id);
}

test('abort() does not order host code that runs before the abort is consumed behind the READ', async () => {
  const { fabric, D, rc, h } = await setup();
  const aborting = D.abort([h]); // flow A aborts the READ (consumed below)
  runAbort(fabric); // the NIC stops it...
  await new Promise((resolve) => setImmediate(resolve)); // ...and every continuation but A's has run
  rc.hostEnqueue('compute', { what: 'zero' }, [page5]); // flow B, before A knows the NIC stopped
  await aborting;
  assert.equal(rc.races().length, 1, 'zero vs kv-read must be reported');
});

test('control: host code after the awaited abort() is ordered behind the READ', async () => {
  const { fabric, D, rc, h } = await setup();
  const aborting = D.abort([h]);
  runAbort(fabric);
  await aborting;
  rc.hostEnqueue('compute', { what: 'zero' }, [page5]);
  assert.deepEqual(rc.races(), []);
});
