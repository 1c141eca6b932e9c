/**
 * handoff_prefix_cache_hits_total counts, like vLLM's prefix_cache_hits, the prompt tokens a request found
 * in the prefix cache when it was first admitted. A preempted request is admitted again and then "hits"
 * its own pages (prompt and generated tokens alike): that later lookup replaced the first one, so unique
 * prompts under preemption reported more hits than prompt tokens queried (a hit rate above 100%). Here
 * four requests with prompts sharing no token run in a pool too small for all of them: they are
 * preempted, and the hits must stay 0.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_INSTANCE_OPTIONS, startInstance } from './instance.ts';

const env = new RealEnv(47);

function metric(text: string, name: string): number {
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'm').exec(text);
  return Number(m?.[1] ?? NaN);
}

test('unique prompts that are preempted report no prefix-cache hit', async () => {
  const inst = await startInstance(
    { ...DEFAULT_INSTANCE_OPTIONS, role: 'both', port: 0, numBlocks: 16, scheduler: { maxModelLen: 96 } },
    env,
  );
  try {
    const post = (k: number): Promise<number> =>
      fetch(`${inst.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          prompt: Array.from({ length: 20 }, (_, j) => 1000 + 50 * k + j),
          max_tokens: 60,
          ignore_eos: true,
          temperature: 0,
        }),
        signal: AbortSignal.timeout(60_000),
      }).then(async (r) => (await r.text(), r.status));
    assert.deepEqual(await Promise.all([1, 2, 3, 4].map(post)), [200, 200, 200, 200]);
    const text = (await inst.server.metrics.text()).body;
    assert.ok(metric(text, 'handoff_preemptions_total') > 0, 'the pool is small enough to preempt');
    assert.equal(metric(text, 'handoff_prefix_cache_queries_total'), 80);
    assert.equal(metric(text, 'handoff_prefix_cache_hits_total'), 0, 'a re-admission hit its own pages');
  } finally {
    await inst.close();
  }
});
