/**
 * The seed's A/B in real threads, small: on dsv4-mini the race checker reports zero-vs-READ races for
 * `none` (found from happens-before, so it does not depend on this run's timing), and `all-read-groups`
 * matches the colocated reference on every request, token for token and logit for logit, with no race.
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
