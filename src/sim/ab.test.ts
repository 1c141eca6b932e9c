/**
 * The seed's A/B in real threads, small: on dsv4-mini the race checker reports zero-vs-READ races for
 * `none` (found from happens-before, so it does not depend on this run's timing), and `all-read-groups`
 * matches the colocated reference on every request, token for token and logit for logit, with no race.
 * With other block sizes on the two sides (issue 14) the fix still matches, every READ loads (none is
 * recomputed), and clipped tails are zeroed exactly when decode's pages are the larger.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { runAb, AB_VARIANTS } from './ab.ts';

test('ab on dsv4-mini: none races, all-read-groups matches colocated with zero races', async () => {
  const variants = AB_VARIANTS.filter((v) => v.name === 'none' || v.name === 'all-read-groups');
  const r = await runAb(
    { preset: 'dsv4-mini', requests: 6, maxTokens: 4, seed: 2, arrivalGapMs: 2, variants },
    new RealEnv(9),
  );
  const none = r.variants.find((v) => v.name === 'none');
  const fixed = r.variants.find((v) => v.name === 'all-read-groups');
  assert.ok(none && fixed);
  assert.ok(none.races > 0, 'zeroing queued on the stream and READs posted by the host are unordered');
  assert.ok(
    none.sampleRace?.includes('zero') && none.sampleRace.includes('kv-read'),
    'the race names the zero op and the READ',
  );
  assert.equal(fixed.races, 0);
  assert.equal(fixed.exactMatch, 6);
  assert.equal(fixed.errors, 0);
  assert.ok(fixed.pagesExcludedFromZeroing > 0, 'the fix removed READ destinations from the zero list');
});

for (const [prefillBlockSize, decodeBlockSize] of [
  [8, 32],
  [32, 8],
] as const) {
  test(`ab on dsv4-mini, prefill ${prefillBlockSize} / decode ${decodeBlockSize} tokens per page: all-read-groups matches colocated, 0 races, every READ loads`, async () => {
    const variants = AB_VARIANTS.filter((v) => v.name === 'all-read-groups');
    const r = await runAb(
      {
        preset: 'dsv4-mini',
        requests: 6,
        maxTokens: 4,
        seed: 2,
        arrivalGapMs: 2,
        variants,
        prefillBlockSize,
        decodeBlockSize,
      },
      new RealEnv(9),
    );
    const fixed = r.variants[0];
    assert.ok(fixed);
    assert.deepEqual([r.prefillBlockSize, r.decodeBlockSize], [prefillBlockSize, decodeBlockSize]);
    assert.deepEqual(
      { exact: fixed.exactMatch, races: fixed.races, errors: fixed.errors, loadFailures: fixed.loadFailures },
      { exact: 6, races: 0, errors: 0, loadFailures: 0 },
    );
    if (decodeBlockSize > prefillBlockSize)
      assert.ok(fixed.tailsZeroed > 0, 'decode pages larger: clipped tails zeroed');
    else assert.equal(fixed.tailsZeroed, 0, 'decode pages smaller: every destination page is filled whole');
  });
}
