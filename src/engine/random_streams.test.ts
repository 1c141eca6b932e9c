/**
 * Property: random request streams (shared prefixes, staggered arrivals, aborts, stop tokens, page
 * pressure, chunked prefill on/off, prefix caching on/off, async depth 1/2) through a real runner on the
 * sim device: every request that was not aborted gives the tokens and logits it gives alone; at the end
 * every page is back and the pool's invariants hold.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { makeHarness, runAlone } from './runner_testkit.ts';

const PRESETS = ['dsv4-micro', 'llama-micro', 'hybrid-micro'] as const;

test('property: random streams equal each request alone, nothing leaks', async () => {
  const aloneCache = new Map<string, { tokens: number[]; hashes: string[] }>();
  await fc.assert(
    fc.asyncProperty(
      fc.constantFrom(...PRESETS),
      fc.integer({ min: 10, max: 40 }),
      fc.integer({ min: 8, max: 64 }),
      fc.integer({ min: 1, max: 2 }),
      fc.boolean(),
      fc.boolean(),
      fc.integer({ min: 1, max: 4 }),
      fc.constantFrom(1, 4, 16, 32),
      fc.nat(3),
      fc.array(
        fc.record({
          base: fc.nat(2),
          prefix: fc.integer({ min: 0, max: 70 }),
          tail: fc.integer({ min: 1, max: 20 }),
          maxTokens: fc.integer({ min: 1, max: 12 }),
          arriveAt: fc.nat(8),
          abortAt: fc.option(fc.integer({ min: 0, max: 12 }), { freq: 4 }),
          stop: fc.option(fc.nat(63), { freq: 2 }),
          temperature: fc.constantFrom(0, 0.8),
        }),
        { minLength: 1, maxLength: 7 },
      ),
      async (preset, numBlocks0, budget, depth, chunked, caching, maxNumSeqs, blockSize, lookahead, specs) => {
        const numBlocks = Math.ceil((numBlocks0 * 16) / blockSize);
        const sched = {
          maxNumBatchedTokens: budget,
          maxNumSeqs,
          maxModelLen: 128,
          enableChunkedPrefill: chunked,
          enablePrefixCaching: caching,
          numLookaheadTokens: lookahead,
        };
        const h = await makeHarness(preset, numBlocks, sched, blockSize);
        const prompts = specs.map((s, i) => {
          const shared = Array.from({ length: s.prefix }, (_, k) => (s.base * 17 + k * 7) % 61);
          const own = Array.from({ length: s.tail }, (_, k) => (i * 13 + k * 3 + 1) % 61);
          return [...shared, ...own];
        });
        const extras = specs.map((s) => ({
          stopTokenIds: s.stop === null ? [] : [s.stop],
          temperature: s.temperature,
        }));
        const added = new Set<number>();
        const aborted = new Set<number>();
        let steps = 0;
        for (; steps < 600; steps++) {
          specs.forEach((s, i) => {
            if (!added.has(i) && s.arriveAt <= steps) {
              try {
                h.add(`r${i}`, prompts[i] as number[], s.maxTokens, extras[i]);
              } catch {
                h.finished.set(`r${i}`, 'refused');
              }
              added.add(i);
            }
            if (s.abortAt === steps && added.has(i)) (aborted.add(i), h.abort(`r${i}`));
          });
          if (added.size === specs.length && !h.scheduler.hasWork() && h.inFlight === 0) break;
          while (h.inFlight < depth && h.scheduler.hasWork()) await h.launch();
          await h.land();
          h.kv.blockPool.verify();
        }
        assert.ok(steps < 600, 'every request ends');
        for (let i = 0; i < specs.length; i++) {
          const why = h.finished.get(`r${i}`);
          assert.ok(why, `r${i} finished`);
          if (why === 'refused' || aborted.has(i)) continue;
          assert.notEqual(why, 'error', `r${i} failed`);
          const s = specs[i]!;
          const key = JSON.stringify([preset, sched, blockSize, s.maxTokens, extras[i], prompts[i]]);
          let alone = aloneCache.get(key);
          if (!alone) {
            alone = await runAlone(preset, prompts[i]!, s.maxTokens, sched, extras[i], blockSize);
            aloneCache.set(key, alone);
          }
          assert.deepEqual(h.tokens.get(`r${i}`), alone.tokens, `r${i} (${preset}) tokens = alone`);
          assert.deepEqual(h.hashes.get(`r${i}`), alone.hashes, `r${i} (${preset}) logits = alone`);
        }
        assert.ok(h.scheduler.isQuiescent(), 'quiescent');
        assert.equal(h.kv.getNumFreeBlocks(), numBlocks - 1, 'every page back');
      },
    ),
    { numRuns: Number(process.env.RUNS ?? 60), seed: process.env.SEED ? Number(process.env.SEED) : undefined },
  );
});
