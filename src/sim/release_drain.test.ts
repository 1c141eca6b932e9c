/**
 * READ mode: two decode requests may name one transfer (keyed by request id: a client retry under a fresh
 * X-Request-Id with the same kv_transfer_params). When the first one's `release` reaches prefill, the
 * grant is revoked, but the second one's READ, already admitted by the NIC, may still be moving bytes
 * from prefill's pages. Prefill must wait for the drain (TransferEngine.drainGrant, as a lease's end
 * does) before it reports the pages free: otherwise they go back to the pool, another request's forward
 * writes them, and the READ still under way hands decode someone else's KV (the page lifecycle oracle:
 * I4, freed while granted to a peer).
 *
 * In the simulated world (1p1d, random schedules): once request 0 is in its decode leg, a duplicate decode
 * request with the same params is submitted to decode; every seed must pass every oracle.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { judgeEnd } from './oracles.ts';
import { SimWorld } from './world.ts';
import { DEFAULT_SIM_PRESET } from './run_sim.ts';

async function runWithDuplicate(seed: number): Promise<{ violations: string[]; dup: string }> {
  const w = await SimWorld.create({
    scenario: '1p1d',
    preset: DEFAULT_SIM_PRESET,
    seed,
    strategy: 'random',
    stopOnViolation: false,
  });
  let dup = 'not submitted';
  let dupIndex = -1;
  const dupTokens: number[] = [];
  const first = (): (typeof w.proxy.requests)[number] | undefined =>
    w.proxy.requests.find((r) => r.phase === 'decode' && r.prefillAnswer?.params != null);
  w.addAction({
    key: 'act:dup-decode',
    name: 'a duplicate decode request with the same kv_transfer_params',
    enabled: () => w.D.alive && first() !== undefined,
    run: () => {
      const r = first();
      if (r === undefined) return;
      dup = 'running';
      dupIndex = r.spec.index;
      const params = { ...(r.prefillAnswer?.params as object), do_remote_prefill: true, do_remote_decode: false };
      w.D.engine.submit(
        {
          requestId: `dup-${r.spec.index}`,
          promptTokenIds: r.spec.promptTokenIds,
          sampling: r.spec.sampling,
          kvTransferParams: params as never,
        },
        (o) => {
          dupTokens.push(...o.newTokenIds);
          if (o.finishReason !== null) dup = o.finishReason;
        },
      );
    },
  });
  await w.run();
  await judgeEnd(w);
  await w.shutdown();
  // I5 judges a release as the end of every READ of its transfer (one reader per transfer): with two
  // readers the first one's release is expected while the other READ runs, so it is left out here.
  const judged = w.violations.filter((v) => v.invariant !== 'I5').map((v) => `${v.oracle}: ${v.message}`);
  // Same prompt, same greedy sampling: a duplicate that loaded its own KV answers like the original.
  const original = w.proxy.requests[dupIndex]?.outcome;
  if (original?.ok && (dup === 'length' || dup === 'stop') && original.tokenIds.join() !== dupTokens.join())
    judged.push(`duplicate answered [${dupTokens.join()}], the original [${original.tokenIds.join()}]`);
  return { violations: judged, dup };
}

test('READ: a release while another READ of the same transfer is under way frees the pages only once drained', async () => {
  const failing: string[] = [];
  for (let seed = 1; seed <= 40; seed++) {
    const r = await runWithDuplicate(seed);
    if (r.violations.length > 0) failing.push(`seed ${seed} (dup ${r.dup}): ${r.violations.join(' | ').slice(0, 300)}`);
  }
  assert.deepEqual(failing, []);
});
