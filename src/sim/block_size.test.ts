/**
 * Block size per deployment (`--block-size`, both instances alike): with 8 and 32 tokens per page the
 * P/D worlds still pass every oracle (P/D == colocated against a reference paged by 16: the output does
 * not depend on the page size), and the seed's bug is still caught.
 *
 * Heterogeneous sizes (issue 14, `--prefill-block-size` / `--decode-block-size`): the hetero table, every
 * pairing of {8, 16, 32} on each micro preset, passes every oracle on hetero-block (READ or WRITE by seed;
 * 0 races, P/D == colocated token for token and logit for logit); the loads really move the KV across
 * sizes (no load fails, clipped tails are zeroed); forgetting the tail's zeroing is caught at seed 1.
 * Sizes that cannot be mapped are refused at the handshake (transfer/core/metadata.test.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isHandoffError } from '../util/errors.ts';
import { MICRO_PRESETS, type ModelPreset } from '../kv/presets.ts';
import { runSim } from './run_sim.ts';
import { buildScenario, HETERO_PAIRINGS } from './scenarios.ts';
import { SimWorld } from './world.ts';
import { tallyWorlds } from './load_tally.ts';

for (const blockSize of [8, 32]) {
  test(`block size ${blockSize}: 1p1d, 1p1d-write and prefix-hit pass every oracle; zero-mamba-only is caught`, async () => {
    for (const scenario of ['1p1d', '1p1d-write', 'prefix-hit'] as const) {
      const r = await runSim({ scenario, strategy: 'random', seeds: 3, blockSize });
      assert.equal(r.firstFailingSeed, null, `${scenario}: ${r.violations[0]?.message ?? ''}`);
    }
    const bug = await runSim({ scenario: '1p1d', strategy: 'random', seeds: 2, blockSize, mutant: 'zero-mamba-only' });
    assert.equal(bug.firstFailingSeed, 1);
    assert.match(bug.replay ?? '', new RegExp(`--block-size ${blockSize}`), 'the replay line names the block size');
  });
}

test('block size: both engines page by it; pools keep their capacity in tokens; a non power of two is BAD_CONFIG', async () => {
  const w = await SimWorld.create({
    scenario: '1p1d',
    preset: 'dsv4-micro',
    seed: 1,
    strategy: 'random',
    blockSize: 8,
  });
  for (const inst of w.instances)
    assert.deepEqual(
      inst.kvConfig.groups.map((g) => g.spec.blockSize),
      [8, 8],
    );
  await w.shutdown();
  assert.equal(buildScenario('preempt', 'dsv4-micro', 1, { blockSize: 8 }).decode.numBlocks, 1 + 24);
  assert.equal(buildScenario('preempt', 'dsv4-micro', 1, { decodeBlockSize: 32 }).prefill.blockSize, 16);
  assert.equal(buildScenario('1p1d', 'dsv4-micro', 1).decode.numBlocks, 64);
  assert.throws(
    () => buildScenario('1p1d', 'dsv4-micro', 1, { blockSize: 12 }),
    (e: unknown) => isHandoffError(e) && e.code === 'BAD_CONFIG',
  );
});

const SIZES = [8, 16, 32];

for (const model of MICRO_PRESETS) {
  test(`hetero table, ${model}: every pairing of {8, 16, 32} (prefill x decode) passes every oracle on hetero-block`, async () => {
    for (const prefillBlockSize of SIZES)
      for (const decodeBlockSize of SIZES) {
        const r = await runSim({
          scenario: 'hetero-block',
          strategy: 'random',
          seeds: 1,
          model,
          prefillBlockSize,
          decodeBlockSize,
        });
        assert.equal(
          r.firstFailingSeed,
          null,
          `P${prefillBlockSize}/D${decodeBlockSize}: ${r.violations[0]?.message ?? ''}`,
        );
      }
  });
}

/** Runs hetero-block seeds and sums what decode's connector and scheduler counted. */
function loads(model: ModelPreset, prefillBlockSize: number, decodeBlockSize: number, seeds: number[]) {
  return tallyWorlds(seeds, (seed) => ({
    scenario: 'hetero-block',
    preset: model,
    seed,
    strategy: 'random',
    prefillBlockSize,
    decodeBlockSize,
  }));
}

test("hetero: the KV really moves across sizes (READs and WRITEs, none fails); decode pages larger than prefill's get their tails zeroed, smaller ones none", async () => {
  // Seeds 1 and 2 of hetero-block: one WRITE world and one READ world (the mode is drawn from the seed).
  assert.deepEqual([1, 2].map((s) => buildScenario('hetero-block', 'dsv4-micro', s).mode).sort(), ['read', 'write']);
  const up = await loads('dsv4-micro', 8, 32, [1, 2]);
  assert.deepEqual({ ...up, tails: up.tails > 0 }, { violations: 0, reads: 4, writes: 4, failed: 0, tails: true });
  const down = await loads('dsv4-micro', 32, 8, [1, 2]);
  assert.deepEqual(down, { violations: 0, reads: 4, writes: 4, failed: 0, tails: 0 });
  const llama = await loads('llama-micro', 8, 32, [1, 2]);
  assert.equal(llama.tails, 0, 'one precision, no Mamba: nothing is zeroed, stale bytes are harmless');
});

test('clip-tail-not-zeroed: caught at seed 1 with P 8 / D 32 (random and pct) as I2; the replay names both sizes', async () => {
  for (const strategy of ['random', 'pct'] as const) {
    const r = await runSim({
      scenario: 'hetero-block',
      strategy,
      seeds: 1,
      prefillBlockSize: 8,
      decodeBlockSize: 32,
      mutant: 'clip-tail-not-zeroed',
    });
    assert.equal(r.firstFailingSeed, 1, strategy);
    assert.ok(r.violations.some((v) => v.invariant === 'I2' && /clipped tail left stale/.test(v.message)));
    assert.match(r.replay ?? '', /--prefill-block-size 8 --decode-block-size 32 --replay$/);
  }
});

test('hetero-block: the pairing is drawn from the seed among the unequal ones unless the options name sizes; pools keep tokens per side', () => {
  const drawn = new Set<string>();
  for (let seed = 1; seed <= 40; seed++) {
    const c = buildScenario('hetero-block', 'dsv4-micro', seed);
    assert.notEqual(c.prefill.blockSize, c.decode.blockSize);
    drawn.add(`${c.prefill.blockSize}/${c.decode.blockSize}`);
  }
  assert.equal(drawn.size, HETERO_PAIRINGS.length);
  const c = buildScenario('hetero-block', 'dsv4-micro', 1, { blockSize: 8, decodeBlockSize: 32 });
  assert.deepEqual([c.prefill.blockSize, c.decode.blockSize], [8, 32]);
  assert.deepEqual([c.prefill.numBlocks, c.decode.numBlocks], [1 + 126, 1 + 32]);
  assert.equal(buildScenario('hetero-block', 'hybrid-micro', 1).mode, 'read', 'WRITE needs a model without Mamba');
});

/**
 * Worlds a long hunt found broken (session 7); each failed before its fix, at the seed named.
 *   - tight-write, P 4 / D 32, seed 800034 (I1): a request's WRITE load finished, its tails' zeroing was
 *     queued behind the next step's forward, the request was aborted and its pages freed once that step
 *     was processed, handed to the next request, and zeroed after that request's WRITE had landed.
 *   - tight-write, P 4 / D 64, seed 1200093 (I4): prefill's lease ended and its pages were freed at once,
 *     while its worker, not told yet, pushed them to decode's late destination.
 *   - 1p1d with 8 requests, P 4 / D 64, seed 2500044 (race): a step whose only request lost its READ ran
 *     no forward, so its output did not wait for the stream; counted as processed, it let the request's
 *     pages be freed and re-used as READ destinations two steps later, unordered with its zeroing of them.
 *   - chunked-prefill on llama-micro, 8 requests, P 64 / D 4, PCT seed 3500002 (liveness): the explorer
 *     kept picking prefill's long chunks, whose costs add to the one clock, and decode's handshake with
 *     prefill waited 62 ms of it: it timed out although no fault was injected (a simulator bug: now a
 *     message waits at most COST.netWaitMaxMs before it goes first).
 */
const HUNTED = [
  { scenario: 'tight-write', strategies: ['pct'], seed: 800_000, seeds: 40, pages: [4, 32], requests: undefined },
  {
    scenario: 'tight-write',
    strategies: ['random', 'pct'],
    seed: 1_200_080,
    seeds: 20,
    pages: [4, 64],
    requests: undefined,
  },
  { scenario: '1p1d', strategies: ['random'], seed: 2_500_040, seeds: 10, pages: [4, 64], requests: 8 },
  {
    scenario: 'chunked-prefill',
    strategies: ['pct'],
    seed: 3_500_000,
    seeds: 5,
    pages: [64, 4],
    requests: 8,
    model: 'llama-micro',
  },
] as const;

for (const h of HUNTED) {
  const [prefillBlockSize, decodeBlockSize] = h.pages;
  test(`hunted: ${h.scenario} on ${'model' in h ? h.model : 'dsv4-micro'}, P ${prefillBlockSize} / D ${decodeBlockSize}, ${h.requests ?? 'default'} requests, seeds ${h.seed}+${h.seeds} pass every oracle`, async () => {
    for (const strategy of h.strategies) {
      const r = await runSim({ ...h, strategy, prefillBlockSize, decodeBlockSize });
      assert.equal(r.firstFailingSeed, null, `${strategy}: ${r.violations[0]?.message ?? ''}`);
    }
  });
}
