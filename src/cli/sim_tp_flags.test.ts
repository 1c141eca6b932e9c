/**
 * `handoff sim` honours what its flags name. On hetero-tp an explicit `--prefill-tp 1 --decode-tp 1` (or
 * `--tensor-parallel-size 1`) was dropped (only degrees other than 1 were passed on), so the world ran the
 * TP degrees drawn from the seed instead: tp-slice-off-by-one, which needs unequal degrees, still failed;
 * and the replay line must name those degrees, or it replays the drawn ones. In a sweep, `--schedule`
 * was accepted and silently ignored (every pair ran its full search and exited 0), and a sweep whose every
 * scenario the model cannot play ran nothing and exited 0 with "no violation".
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cli, assertBadConfig } from './cli_testkit.ts';
import { replayCommand } from '../sim/run_sim.ts';

test('sim hetero-tp: an explicit TP 1/1 runs at 1/1, not at degrees drawn from the seed', () => {
  for (const tp of [
    ['--prefill-tp', '1', '--decode-tp', '1'],
    ['--tensor-parallel-size', '1'],
  ]) {
    const r = cli(
      ['sim', '--scenario', 'hetero-tp', ...tp, '--mutant', 'tp-slice-off-by-one', '--seeds', '1', '--jobs', '1'],
      30_000,
    );
    assert.equal(
      r.status,
      0,
      `equal degrees cannot mis-slice heads: ${r.stdout.slice(0, 400)} ${r.stderr.slice(-300)}`,
    );
  }
});

test('sim hetero-tp: the replay line names explicit TP degrees, 1/1 included', () => {
  const line = replayCommand({ scenario: 'hetero-tp', strategy: 'random', prefillTp: 1, decodeTp: 1 }, 3);
  assert.match(line, /--prefill-tp 1 --decode-tp 1/);
  // Drawn degrees (none named) stay unnamed: the replay draws them from the same seed.
  assert.doesNotMatch(replayCommand({ scenario: 'hetero-tp', strategy: 'random' }, 3), /--(prefill|decode)-tp/);
  assert.doesNotMatch(
    replayCommand({ scenario: '1p1d', strategy: 'random', prefillTp: 1, decodeTp: 1 }, 3),
    /--(prefill|decode)-tp/,
  );
});

test('sim sweep: --schedule is refused, not ignored', () => {
  assertBadConfig(
    cli(['sim', '--strategy', 'dpor,random', '--schedule', '0.1', '--max-schedules', '2', '--seeds', '1'], 30_000),
    '--schedule',
  );
});

test('sim sweep: when no named scenario can be played it is BAD_CONFIG, not an exit 0 "no violation"', () => {
  const r = cli(
    ['sim', '--scenario', '1p1d-write', '--strategy', 'random,pct', '--model', 'hybrid-micro', '--seeds', '1'],
    30_000,
  );
  assertBadConfig(r, 'Mamba|READ only');
});
