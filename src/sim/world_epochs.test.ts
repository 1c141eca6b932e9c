/**
 * The request half of I7 (page ownership epochs) in a live world: a transfer posted for one request may
 * not write pages that another live request owns now, while posting into the request's own pages is
 * legal. The world is stopped mid-run (a step budget) where two decode requests hold pages, and one
 * READ work request is posted on its fabric by hand, as the NIC would post it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { FabricItem } from '../transfer/sim/sim_fabric.ts';
import { SimWorld } from './world.ts';

/** Seed 1 of 1p1d (random), stopped after the first step budget that leaves two decode requests holding pages. */
async function worldWithTwoOwners(): Promise<{ w: SimWorld; a: string; b: string; pagesOfB: number[] }> {
  for (let steps = 4; steps < 200; steps += 4) {
    const w = await SimWorld.create({
      scenario: '1p1d',
      preset: 'dsv4-micro',
      seed: 1,
      strategy: 'random',
      maxSteps: steps,
    });
    await w.run();
    const holders = w.proxy.requests
      .map((r) => w.proxy.decodeId(r))
      .filter((id) => w.D.engine.kv.getBlockIds(id).flat().length > 0);
    if (holders.length >= 2) {
      const [a, b] = holders as [string, string];
      return { w, a, b, pagesOfB: w.D.engine.kv.getBlockIds(b).flat() };
    }
  }
  throw new Error('no step budget left two decode requests holding pages');
}

function postRead(w: SimWorld, requestId: string, blocks: number[]): void {
  const pageBytes = w.D.kvConfig.pageBytes;
  const item: FabricItem = {
    id: w.fabric.newItemId(),
    kind: 'read',
    from: w.D.engineId,
    to: w.P.engineId,
    label: { what: 'kv-read', requestIds: [requestId] },
    bytes: blocks.length * pageBytes,
    transferId: `xfer-test-${requestId}`,
    notBeforeMs: 0,
    run: () => undefined,
    cancel: () => undefined,
  };
  const local = blocks.map((b) => ({ slab: 0, offset: b * pageBytes, length: pageBytes }));
  w.fabric.emit({ t: 'post', item, rcId: null, local, remote: [] });
}

test('I7 (request half): a READ posted for one request into pages another live request owns is a stale writer', async () => {
  const { w, a, b, pagesOfB } = await worldWithTwoOwners();
  const before = w.violations.filter((v) => v.invariant === 'I7').length;
  postRead(w, b, pagesOfB);
  assert.equal(w.violations.filter((v) => v.invariant === 'I7').length, before, 'its own pages: legal');
  postRead(w, a, pagesOfB);
  const i7 = w.violations.filter((v) => v.invariant === 'I7').slice(before);
  assert.equal(i7.length, 1);
  assert.match(i7[0]!.message, new RegExp(`READ net#\\d+ posted for ${a} writes pages owned by ${b}`));
});
