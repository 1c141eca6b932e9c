/**
 * The page lifecycle oracle attached to a real engine (sim device) through the pool's and the
 * stream's observers: silent on normal generation, and it reports a page used after it was freed and
 * a zero from a page's previous owner landing on its next one, when the pool is driven directly.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { AssertionFailure } from '../util/assert.ts';
import { RealEnv } from '../util/env.ts';
import type { LifecycleViolation } from '../kv/page_lifecycle.ts';
import { attentionSlabs } from '../kv/spec.ts';
import type { ModelPreset } from '../kv/presets.ts';
import { LLMEngine } from './llm_engine.ts';
import { simDevice } from './devices.ts';
import { attachLifecycleOracle } from './lifecycle_oracle.ts';

async function engineWithOracle(
  preset: ModelPreset,
): Promise<{ engine: LLMEngine; seen: LifecycleViolation[]; oracle: ReturnType<typeof attachLifecycleOracle> }> {
  const engine = await LLMEngine.create(
    {
      preset,
      modelSeed: 1,
      numBlocks: 48,
      asyncScheduling: true,
      scheduler: { maxNumBatchedTokens: 32, maxNumSeqs: 4 },
      idlePollMs: 2,
      makeDevice: simDevice(preset, 1, { autoRun: true }),
    },
    new RealEnv(5),
  );
  const seen: LifecycleViolation[] = [];
  const oracle = attachLifecycleOracle(engine, 'E', (v) => seen.push(v));
  return { engine, seen, oracle };
}

const prompt = (n: number): number[] => Array.from({ length: n }, (_, i) => (i * 7919 + 13) % 50000);

for (const preset of ['hybrid-mini', 'llama-mini'] as const) {
  test(`${preset}: normal generation raises no lifecycle violation, and the oracle did watch it`, async () => {
    const { engine, seen, oracle } = await engineWithOracle(preset);
    try {
      const outs = await Promise.all(
        [prompt(40), prompt(9)].map((p) =>
          engine.generate({ promptTokenIds: p, sampling: { maxTokens: 5, ignoreEos: true } }),
        ),
      );
      for (const o of outs) assert.equal(o.tokenIds.length, 5);
      for (let k = 0; k < 100 && !engine.core.isIdle(); k++) await new Promise((r) => setTimeout(r, 2));
      assert.deepEqual(seen, []);
      assert.equal(oracle.violations(), 0);
      // The oracle saw pages come and go: some page went through the pool and back.
      const states = Array.from({ length: engine.kvConfig.numBlocks }, (_, b) => oracle.lifecycle.state(b));
      assert.ok(states.includes('freed'), `no page was seen freed: ${states.join(',')}`);
      assert.equal(oracle.lifecycle.allocatedCount(), 0);
    } finally {
      oracle.detach();
      await engine.close();
    }
  });
}

test('a page used after it was freed is reported (I4, I6); after detach nothing more is', async () => {
  const { engine, seen, oracle } = await engineWithOracle('llama-mini');
  try {
    const pool = engine.kv.blockPool;
    const [a, b] = pool.getNewBlocks(2);
    assert.ok(a && b);
    pool.freeBlocks([a]);
    const slabs = attentionSlabs(engine.kvConfig);
    // Copy out of the freed page (a forward reading it), then zero it: neither may touch a freed page.
    await engine.device.compute.enqueue({
      op: { kind: 'copy', pairs: [[a.blockId, b.blockId]], slabs },
      label: { what: 'cow' },
    }).done;
    await engine.device.compute.enqueue({ op: { kind: 'zero', blockIds: [a.blockId], slabs }, label: { what: 'zero' } })
      .done;
    assert.deepEqual(
      seen.map((v) => [v.invariant, v.block]),
      [
        ['I4', a.blockId],
        ['I6', a.blockId],
      ],
    );
    assert.match(seen[0]?.message ?? '', /reads a freed page/);
    assert.equal(oracle.violations(), 2);
    oracle.detach();
    await engine.device.compute.enqueue({ op: { kind: 'zero', blockIds: [a.blockId], slabs }, label: { what: 'zero' } })
      .done;
    assert.equal(seen.length, 2, 'a detached oracle hears nothing');
    pool.freeBlocks([b]);
  } finally {
    await engine.close();
  }
});

test("a zero queued by a page's previous owner that lands on its next owner is reported (I1)", async () => {
  const { engine, seen, oracle } = await engineWithOracle('llama-mini');
  try {
    const pool = engine.kv.blockPool;
    const before = pool.getNumFreeBlocks();
    const [a] = pool.getNewBlocks(1);
    assert.ok(a);
    // autoRun executes at the next microtask: free and reallocate the page before the zero runs.
    const zero = engine.device.compute.enqueue({
      op: { kind: 'zero', blockIds: [a.blockId], slabs: attentionSlabs(engine.kvConfig) },
      label: { what: 'zero' },
    });
    pool.freeBlocks([a]);
    const again = pool.getNewBlocks(before);
    assert.ok(again.some((x) => x.blockId === a.blockId));
    await zero.done;
    assert.deepEqual(
      seen.map((v) => [v.invariant, v.block]),
      [['I1', a.blockId]],
    );
    pool.freeBlocks(again);
  } finally {
    oracle.detach();
    await engine.close();
  }
});

test('a page freed twice is stopped by the pool itself, before the oracle could see it', async () => {
  const { engine, seen, oracle } = await engineWithOracle('llama-mini');
  try {
    const pool = engine.kv.blockPool;
    const [a] = pool.getNewBlocks(1);
    assert.ok(a);
    pool.freeBlocks([a]);
    assert.throws(() => pool.freeBlocks([a]), AssertionFailure);
    assert.deepEqual(seen, []);
  } finally {
    oracle.detach();
    await engine.close();
  }
});
