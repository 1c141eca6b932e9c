/**
 * DPOR's dependence relation against the world: two steps it calls independent must commute (the same
 * enabled work in either order). A prefill forward that finishes its leg makes the proxy submit the decode
 * request to D's engine in that step's continuation, so it writes D's host state (the proxy's `touches`
 * hook, recorded as an observed write): it is dependent with a decode forward. Before, the two were
 * declared independent while their orders left different states (D's READ posted in one, not the other),
 * and DPOR merged two traces. The test drives the real DporWorldExplorer with a scripted chooser (so the
 * footprints, timer flags and observed writes are what DporSearch records), finds a state with both
 * forwards enabled, runs both orders, and checks: dependent, or the same state after both.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimWorld } from './world.ts';
import { DporWorldExplorer } from './dpor_world.ts';
import { dependent, type Candidate, type DporChooser, type Footprint } from './dpor.ts';
import { SeededRng } from '../util/env.ts';

function describe(w: SimWorld, keys: readonly string[]): string {
  return keys
    .map((k) => {
      const m = /^(\w+)\.op#(\d+)/.exec(k);
      if (m) {
        const inst = w.instances.find((i) => i.name === m[1])!;
        const o = inst.ops.get(Number(m[2]));
        return `${m[1]}:${o?.what}:${o?.requestIds.join(',')}`;
      }
      const n = /^net#(\d+)$/.exec(k);
      if (n) {
        const it = w.fabric.queued().find((x) => x.id === Number(n[1]));
        return `net:${it?.kind}:${it?.label.requestIds?.join(',') ?? it?.label.what}`;
      }
      return k;
    })
    .sort()
    .join(' | ');
}

interface Run {
  at: number | null;
  pair: [string, string] | null;
  events: Footprint[];
  after: string | null;
  decodeReqs: string | null;
}

/** Random prefix (seeded) of `prefix` picks; then either find a P/D kernel pair, or run `pair` in order. */
async function run(seed: number, prefix: number, pair: [string, string] | null): Promise<Run> {
  const rng = new SeededRng(seed);
  const out: Run = { at: null, pair: null, events: [], after: null, decodeReqs: null };
  let w!: SimWorld;
  let fpx!: DporWorldExplorer;
  let step = 0;
  let stage = 0;
  let last: Candidate[] = [];
  let lastKey = '';
  const chooser: DporChooser = {
    choose(enabled: readonly Candidate[]) {
      last = [...enabled];
      const s = step++;
      if (pair === null) {
        if (out.pair === null && s >= prefix) {
          for (const p of enabled.filter((c) => c.key.startsWith('P.op#')))
            for (const d of enabled.filter((c) => c.key.startsWith('D.op#'))) {
              const po = w.P.ops.get(Number(p.key.split('#')[1]));
              const dd = w.D.ops.get(Number(d.key.split('#')[1]));
              if (out.pair === null && po?.kind === 'kernel' && dd?.kind === 'kernel' && po.requestIds.length > 0)
                out.pair = [p.key, d.key];
            }
          if (out.pair !== null) out.at = s;
        }
        return rng.int(enabled.length);
      }
      if (s < prefix) return rng.int(enabled.length);
      if (stage < 2) {
        const key = pair[stage++]!;
        const i = enabled.findIndex((c) => c.key === key);
        assert.ok(i >= 0, `${key} enabled`);
        lastKey = key;
        return i;
      }
      if (stage === 2) {
        stage++;
        out.after = describe(
          w,
          enabled.map((c) => c.key),
        );
        out.decodeReqs = [...w.D.ops.values()].map((o) => o.requestIds.join(',')).join(' ');
      }
      return 0;
    },
    ran(global: boolean, extra: readonly string[] = []) {
      if (pair !== null && stage >= 1 && stage <= 2 && out.events.length < 2) {
        const fp = last.find((c) => c.key === lastKey)!.fp;
        out.events.push({ ...fp, global: fp.global || global, writes: [...fp.writes, ...extra] });
      }
    },
    barrier() {
      if (pair !== null && stage >= 1 && out.events.length < 2)
        out.events.push({ reads: [], writes: [], global: true, costMs: 0 });
    },
    end() {},
  };
  w = await SimWorld.create({
    scenario: '1p1d',
    preset: 'dsv4-micro',
    seed: 0,
    strategy: 'dpor',
    faults: false,
    requests: 3,
    makeExplorer: (ww) => {
      w = ww;
      fpx = new DporWorldExplorer(ww, chooser);
      return fpx;
    },
  });
  await w.run();
  await w.shutdown();
  return out;
}

test('dpor: a prefill forward that finishes its leg and a decode forward are dependent (their orders leave different states)', async () => {
  const seed = 13;
  const found = await run(seed, 0, null);
  assert.ok(found.pair !== null && found.at !== null, 'a state with a P and a D forward both enabled');
  const [p, d] = found.pair;
  const pd = await run(seed, found.at, [p, d]);
  const dp = await run(seed, found.at, [d, p]);
  // What DporSearch would record for the two events (static footprint + timers fired + grants observed).
  assert.equal(pd.events.length, 2);
  assert.equal(dp.events.length, 2);
  const independent = !dependent(pd.events[0]!, pd.events[1]!) && !dependent(dp.events[0]!, dp.events[1]!);
  assert.ok(
    !independent || dp.after === pd.after,
    `${p} / ${d} at choice ${found.at} declared independent, yet P-then-D leaves [${pd.after}], D-then-P leaves [${dp.after}]`,
  );
  assert.ok(!independent, 'here they do not commute: DPOR must see them as dependent');
});
