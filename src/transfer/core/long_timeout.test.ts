/**
 * Proves a timeout or grant lifetime past 2^31 - 1 ms (~24.8 days) is honoured: Node's setTimeout turns
 * such a delay into 1 ms (TimeoutOverflowWarning), so with RealEnv a grant issued with a long ttlMs expired
 * at once and a wait() with a long timeout failed KV_READ_TIMEOUT at once, though both pass the API's checks
 * (finite, > 0). The fix is in RealEnv.setTimer (util/env.ts): long delays are re-armed in steps.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../../util/env.ts';
import { LAYOUT, pageRanges } from '../testing/conformance_support.ts';
import { SimFabric } from '../sim/sim_fabric.ts';
import { SimTransferEngine } from '../sim/sim.ts';

const LONG_MS = 2 ** 31 + 1000;

/** Resolves after every 1 ms timer armed before it fired (Node runs timers in expiry order). */
const later = (): Promise<void> => new Promise((resolve) => setTimeout(resolve, 30));

function engine(env: RealEnv, fabric: SimFabric, engineId: string): SimTransferEngine {
  return new SimTransferEngine({
    env,
    fabric,
    engineId,
    modelName: 'tiny',
    preset: 'dsv4-mini',
    layout: LAYOUT,
    blockSizes: [16, 16],
    slabViews: Array.from({ length: LAYOUT.numSlabs }, () => new Uint8Array(LAYOUT.numBlocks * LAYOUT.pageBytes)),
  });
}

test('RealEnv: a timer longer than 2^31 - 1 ms does not fire early, and can be cancelled', async () => {
  const env = new RealEnv(1);
  let fired = false;
  const t = env.setTimer(LONG_MS, () => (fired = true));
  await later();
  assert.equal(fired, false, 'a 24.8-day timer fired within 30 ms');
  t.cancel();
});

test('a grant with a ttl past 2^31 ms stays live; a wait() with such a timeout does not time out at once', async () => {
  const env = new RealEnv(2);
  const fabric = new SimFabric(false);
  const [P, D] = [engine(env, fabric, 'long-P'), engine(env, fabric, 'long-D')];
  try {
    const hs = D.handshake(P.address());
    await Promise.resolve();
    fabric.run(fabric.queued()[0]!.id);
    await hs;
    const g = P.issueGrant({ transferId: 't-long', peerEngineId: 'long-D', blockIds: [3], ttlMs: LONG_MS });
    const h = D.postRead({
      peerEngineId: 'long-P',
      transferId: 't-long',
      grantToken: g.token,
      ranges: pageRanges([[3, 5]]),
      label: { what: 'kv-read' },
      footprint: [],
    });
    let waitError: unknown = null;
    const waiting = D.wait([h], LONG_MS).catch((e: unknown) => (waitError = e));
    await later();
    assert.equal(P.stats().grantsExpired, 0, 'the grant expired at once');
    assert.equal(waitError, null, `wait() failed at once: ${String(waitError)}`);
    // The READ still runs under the grant and the wait resolves.
    fabric.run(fabric.queued()[0]!.id);
    await waiting;
    assert.equal(waitError, null);
    assert.equal(P.revokeGrant('t-long'), true, 'the grant was still live');
  } finally {
    await Promise.all([P.close(), D.close()]);
  }
});
