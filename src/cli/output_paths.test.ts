/**
 * An output path that cannot be written (`trace --out`, `ab --trace`, `bench transfer
 * --sweep --svg`) is one BAD_CONFIG line naming the flag, exit 1, checked before the run. It was an
 * "internal error (a bug)" stack trace from writeFileSync/mkdirSync, printed only after the work was done
 * (15 s of A/B, minutes of transfer sweep).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { cli, type CliRun } from './cli_testkit.ts';

function assertBadPath(r: CliRun, flag: string): void {
  assert.equal(r.status, 1, `exit 1 (null: still running at the timeout); stderr: ${r.stderr.slice(-400)}`);
  assert.match(r.stderr, new RegExp(`handoff: BAD_CONFIG: ${flag}`), r.stderr.slice(-400));
  assert.doesNotMatch(r.stderr, /internal error/, r.stderr.slice(-400));
}

test('trace: an --out under a file (not a directory) is BAD_CONFIG naming --out, not a stack trace', () => {
  assertBadPath(cli(['trace', '--out', '/dev/null/x']), '--out');
});

test('trace: an --out whose .json is an existing directory is BAD_CONFIG, not a stack trace', () => {
  const dir = mkdtempSync(join(tmpdir(), 'handoff-output-paths-'));
  try {
    mkdirSync(join(dir, 't.json'));
    assertBadPath(cli(['trace', '--out', join(dir, 't')]), '--out');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('ab: a --trace that cannot be written is refused before the A/B runs', () => {
  const args = ['ab', '--model', 'llama-mini', '--requests', '1', '--max-tokens', '1', '--variant', 'none'];
  assertBadPath(cli([...args, '--trace', '/dev/null/x'], 10_000), '--trace');
});

test('bench transfer --sweep: an --svg that cannot be written is refused before the sweep (minutes) runs', () => {
  const args = ['bench', 'transfer', '--sweep', '--backend', 'inproc', '--repeats', '1', '--json'];
  assertBadPath(cli([...args, '--svg', '/dev/null/x.svg'], 15_000), '--svg');
});
