/**
 * `top_k` at or above the vocabulary size is "no top-k", as in vLLM: SamplingParams only refuses
 * top_k < -1, and the input batch treats any top_k outside (0, vocab_size) as off
 * (v1/worker/gpu_input_batch.py: `if 0 < top_k < self.vocab_size: ... else: top_k = self.vocab_size`).
 *
 * Before the fix: `top_k: 50258` (or 100000, a common "no limit" value) was a 400 BAD_REQUEST "top_k
 * must be at most 50257" for a request vLLM serves, and `top_k: 50257` went to the sampler as a real
 * top-k over the whole vocabulary.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { VOCAB_SIZE } from '../model/config.ts';
import { parseApiRequest } from './openai_request.ts';

const limits = { maxModelLen: 256 };

test('top_k >= the vocabulary size is accepted and means no top-k (both endpoints)', () => {
  for (const topK of [VOCAB_SIZE, VOCAB_SIZE + 1, 100_000]) {
    const c = parseApiRequest('completion', { prompt: 'x', top_k: topK }, limits);
    assert.equal(c.topK, undefined, `completion top_k ${topK}`);
    const ch = parseApiRequest('chat', { messages: [{ role: 'user', content: 'x' }], top_k: topK }, limits);
    assert.equal(ch.topK, undefined, `chat top_k ${topK}`);
  }
  assert.equal(parseApiRequest('completion', { prompt: 'x', top_k: VOCAB_SIZE - 1 }, limits).topK, VOCAB_SIZE - 1);
  assert.throws(() => parseApiRequest('completion', { prompt: 'x', top_k: -2 }, limits), /top_k/);
});
