/**
 * A decode that dies after routing chose it (xpyd restarts one decode once idle; a request routed to it
 * just before was then sent to the dead instance): the sim proxy's decode leg must fail like a refused
 * connection, as the HTTP proxy's does, and a decode that dies with legs in flight fails them like a
 * dropped connection. Before, the leg was submitted to the dead engine and waited forever: the liveness
 * oracle fired ("open requests [7:decode], busy instances []") in xpyd pct seed 2500023 (8 requests,
 * prefill pages of 4, decode pages of 64) once transfers were split into several work requests.
 * Proves: every request ends, typed PEER_UNAVAILABLE, and nothing else is reported.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimWorld } from './world.ts';

test('sim proxy: a decode leg sent to a dead decode fails PEER_UNAVAILABLE instead of waiting forever', async () => {
  const w = await SimWorld.create({
    scenario: '1p1d',
    preset: 'dsv4-micro',
    seed: 3,
    strategy: 'random',
    faults: false,
  });
  w.D.kill();
  w.proxy.instanceDied(w.D);
  await w.run();
  await w.shutdown();
  assert.deepEqual(
    w.violations.map((v) => `${v.oracle}: ${v.message}`),
    [],
  );
  assert.ok(w.proxy.requests.length > 0);
  for (const r of w.proxy.requests) {
    assert.equal(r.phase, 'done');
    assert.equal(r.outcome?.ok, false, `request ${r.spec.index} cannot succeed without a decode`);
    assert.equal(r.outcome?.errorCode, 'PEER_UNAVAILABLE', `request ${r.spec.index}: ${r.outcome?.errorMessage}`);
  }
});

test('sim proxy: a decode that dies with a leg in flight fails that leg like a dropped connection', async () => {
  const w = await SimWorld.create({
    scenario: '1p1d',
    preset: 'dsv4-micro',
    seed: 3,
    strategy: 'random',
    faults: false,
  });
  // Kill the decode as soon as the first request reaches it.
  const arrive = w.proxy.arrive.bind(w.proxy);
  let killed = false;
  w.proxy.arrive = (r) => {
    arrive(r);
    if (killed) return;
    const timer = (): void => {
      if (r.phase === 'decode' && !killed) {
        killed = true;
        w.D.kill();
        w.proxy.instanceDied(w.D);
      } else if (r.phase !== 'done') w.env.setTimer(w.env.nowMs() + 0.5, timer);
    };
    timer();
  };
  await w.run();
  await w.shutdown();
  assert.ok(killed, 'the decode died with a request on it');
  const live = w.violations.filter((v) => v.oracle === 'liveness');
  assert.deepEqual(live, [], 'every request ended');
  for (const r of w.proxy.requests) assert.equal(r.phase, 'done');
  assert.ok(w.proxy.requests.some((r) => r.outcome?.errorCode === 'PEER_UNAVAILABLE'));
});
