/**
 * The bench's arithmetic: percentiles (interpolated, exact on known data), a workload that is a pure
 * function of its seed and within its ranges, and a summary that ignores failed requests' latencies.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { makeWorkload, percentile, summarize, type RequestOutcome } from './load_generator.ts';

test('percentile: interpolated between ranks; ends are min and max', () => {
  const xs = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
  assert.equal(percentile(xs, 0), 1);
  assert.equal(percentile(xs, 100), 10);
  assert.equal(percentile(xs, 50), 5.5);
  assert.ok(Math.abs(percentile(xs, 99) - 9.91) < 1e-9);
  assert.equal(percentile([], 50), 0);
  assert.equal(percentile([7], 99), 7);
});

test('workload: same seed same prompts; lengths within the ranges; different seed differs', () => {
  const spec = { requests: 20, promptLen: [3, 9] as [number, number], outputLen: [2, 4] as [number, number], seed: 5 };
  const a = makeWorkload(spec);
  assert.deepEqual(makeWorkload(spec), a);
  assert.notDeepEqual(makeWorkload({ ...spec, seed: 6 }), a);
  for (const w of a) {
    assert.ok(w.prompt.length >= 3 && w.prompt.length <= 9);
    assert.ok(w.maxTokens >= 2 && w.maxTokens <= 4);
    assert.ok(w.prompt.every((t) => Number.isInteger(t) && t >= 0 && t < 50256));
  }
});

test('shared-prefix workload: every prompt is one of K prefixes plus its own suffix; random prompts unchanged', () => {
  const spec = { requests: 40, promptLen: [2, 5] as [number, number], outputLen: [1, 2] as [number, number], seed: 9 };
  const w = makeWorkload({ ...spec, workload: { kind: 'shared-prefix', prefixes: 3, prefixLen: 12 } });
  const prefixes = new Set(w.map((x) => x.prompt.slice(0, 12).join(',')));
  assert.equal(prefixes.size, 3, 'exactly three distinct prefixes over 40 requests');
  for (const x of w) assert.ok(x.prompt.length >= 14 && x.prompt.length <= 17);
  assert.equal(new Set(w.map((x) => x.prompt.join(','))).size, 40, 'suffixes make every prompt unique');
  assert.deepEqual(makeWorkload({ ...spec, workload: { kind: 'random' } }), makeWorkload(spec));
});

test('summary: errors counted, their latencies left out, tokens per second over the wall time', () => {
  const ok = (ttft: number, itl: number[], tokens: number): RequestOutcome => ({
    ok: true,
    ttftMs: ttft,
    itlMs: itl,
    outputTokens: tokens,
    error: null,
  });
  const r = summarize(
    [ok(10, [1, 3], 3), ok(30, [2], 2), { ok: false, ttftMs: 999, itlMs: [999], outputTokens: 50, error: 'HTTP 500' }],
    500,
  );
  assert.deepEqual(Object.keys(r).sort(), [
    'errors',
    'itlMsP50',
    'itlMsP99',
    'requests',
    'tokensPerSec',
    'ttftMsP50',
    'ttftMsP99',
  ]);
  assert.equal(r.requests, 3);
  assert.equal(r.errors, 1);
  assert.equal(r.ttftMsP50, 20);
  assert.equal(r.itlMsP50, 2);
  assert.equal(r.tokensPerSec, 10);
});
