/**
 * The sim backend passes the shared transfer conformance suite on its auto-running fabric, and with an
 * explicit fabric nothing moves until the explorer runs an item: READs, notifications (dropped or
 * duplicated on request) and handshakes; closing a peer fails what is queued to it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { HandoffError } from '../../util/errors.ts';
import { SimEnv } from '../../util/env.ts';
import { transferConformance, LAYOUT, pageRanges } from '../testing/conformance.ts';
import { SimFabric, type FabricEvent } from './sim_fabric.ts';
import { SimTransferEngine } from './sim.ts';

transferConformance('sim');

async function pair(faults = {}) {
  const env = new SimEnv(7);
  const fabric = new SimFabric(false);
  const events: FabricEvent[] = [];
  fabric.onEvent((e) => events.push(e));
  const mk = (engineId: string, fill: number) => {
    const slabViews = Array.from({ length: LAYOUT.numSlabs }, () =>
      new Uint8Array(LAYOUT.numBlocks * LAYOUT.pageBytes).fill(fill),
    );
    const engine = new SimTransferEngine({
      env,
      fabric,
      engineId,
      modelName: 'tiny',
      preset: 'dsv4-mini',
      layout: LAYOUT,
      blockSizes: [16, 16],
      slabViews,
      faults,
      notifyTimeoutMs: 50,
    });
    return { engine, slabViews };
  };
  const P = mk('P', 7);
  const D = mk('D', 0);
  const hs = D.engine.handshake(P.engine.address());
  await Promise.resolve();
  assert.deepEqual(
    fabric.queued().map((i) => i.kind),
    ['handshake'],
    'the handshake waits in the fabric',
  );
  fabric.run(fabric.queued()[0]!.id);
  await hs;
  return { env, fabric, events, P, D };
}

const settle = () => new Promise((r) => setImmediate(r));

test('sim fabric: a READ moves nothing until the explorer runs it; then it lands and wait() resolves', async () => {
  const { fabric, events, P, D } = await pair();
  const g = P.engine.issueGrant({ transferId: 't', peerEngineId: 'D', blockIds: [3], ttlMs: 1000 });
  const h = D.engine.postRead({
    peerEngineId: 'P',
    transferId: 't',
    grantToken: g.token,
    ranges: pageRanges([[3, 5]]),
    label: { what: 'r' },
    footprint: [],
  });
  let done = false;
  void D.engine.wait([h], 100).then(() => (done = true));
  await settle();
  assert.equal(D.slabViews[0]![5 * LAYOUT.pageBytes], 0, 'nothing landed yet');
  assert.equal(D.engine.poll(h).state, 'pending');
  assert.equal(done, false);
  const [item] = fabric.enabled(0);
  assert.equal(item?.kind, 'read');
  fabric.run(item!.id);
  await settle();
  assert.equal(done, true);
  assert.equal(D.slabViews[1]![5 * LAYOUT.pageBytes], 7, 'landed');
  assert.deepEqual(
    events.map((e) => e.t),
    ['grant', 'post', 'land', 'observed'],
  );
});

test('sim fabric: a dropped notification is never delivered and notify() times out; a duplicate is delivered twice', async () => {
  const { env, fabric, P, D } = await pair();
  const got: string[] = [];
  P.engine.onNotification((_from, n) => got.push(n.transferId));
  const lost = D.engine.notify('P', { type: 'release', transferId: 'a' }).then(
    () => 'ok',
    (e: HandoffError) => e.code,
  );
  await settle();
  fabric.run(fabric.queued()[0]!.id, 'drop');
  env.advanceTo(60);
  assert.equal(await lost, 'TIMEOUT');
  const twice = D.engine.notify('P', { type: 'release', transferId: 'b' });
  await settle();
  fabric.run(fabric.queued()[0]!.id, 'duplicate');
  await twice;
  fabric.run(fabric.queued()[0]!.id);
  assert.deepEqual(got, ['b', 'b']);
});

test('sim fabric: a slow READ is not enabled before its delay; closing the peer fails what is queued to it', async () => {
  const { fabric, events, P, D } = await pair({ readDelayMs: 30 });
  const g = P.engine.issueGrant({ transferId: 't', peerEngineId: null, blockIds: [1, 2], ttlMs: 1000 });
  const h = D.engine.postRead({
    peerEngineId: 'P',
    transferId: 't',
    grantToken: g.token,
    ranges: pageRanges([[1, 1]]),
    label: { what: 'r' },
    footprint: [],
  });
  assert.deepEqual(fabric.enabled(0), []);
  assert.equal(fabric.nextEnabledMs(0), 30);
  assert.equal(fabric.enabled(30).length, 1);
  await P.engine.close();
  const r = D.engine.poll(h);
  assert.ok(r.state === 'failed' && r.error.code === 'PEER_UNAVAILABLE');
  assert.deepEqual(fabric.queued(), []);
  assert.ok(events.some((e) => e.t === 'fail' && e.code === 'PEER_UNAVAILABLE'));
  assert.ok(
    D.slabViews[0]!.every((b) => b === 0),
    'nothing landed',
  );
});
