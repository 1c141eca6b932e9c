/**
 * A dpor search without `--seed` explores world 0 (dpor_run.ts), but `sim --strategy dpor --schedule S
 * --replay` and `trace --strategy dpor --schedule S` without `--seed` ran world 1: another workload, so the
 * schedule replayed something other than what the search found (and the replay line it printed said
 * `--seed 1`). dfs has the same default (schedule 0) in both commands.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { cli } from './cli_testkit.ts';

test('sim --strategy dpor --replay without --seed replays world 0, the one the search explored', () => {
  const search = cli(['sim', '--strategy', 'dpor', '--mutant', 'zero-none', '--max-schedules', '1', '--json']);
  const found = JSON.parse(search.stdout) as { firstFailingSeed: number; replay: string };
  assert.match(found.replay, /--seed 0 /);
  const r = cli(['sim', '--strategy', 'dpor', '--mutant', 'zero-none', '--replay', '--schedule', '0', '--json']);
  assert.equal(r.status, 1, r.stderr.slice(-300));
  const replayed = JSON.parse(r.stdout) as { firstFailingSeed: number; replay: string };
  assert.equal(replayed.firstFailingSeed, 0, replayed.replay);
});

test('trace --strategy dpor and dfs without --seed trace seed 0, like sim', () => {
  const dir = mkdtempSync(join(tmpdir(), 'review-cli-trace-'));
  try {
    for (const strategy of ['dpor', 'dfs']) {
      const out = join(dir, strategy);
      const r = cli(['trace', '--strategy', strategy, '--out', out], 30_000);
      assert.equal(r.status, 0, r.stderr.slice(-300));
      const { metadata } = JSON.parse(readFileSync(`${out}.json`, 'utf8')) as { metadata: { title: string } };
      assert.match(metadata.title, new RegExp(`^1p1d ${strategy} seed 0 `));
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
