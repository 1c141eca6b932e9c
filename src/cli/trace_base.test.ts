/**
 * `trace --out` and `ab --trace` take a base name and write `<base>.json` and `<base>.html`. A base that
 * names a directory ('dir/', 'dir/.json') or '.' was accepted: trace exited 0 having written the hidden files
 * 'dir/.json' and 'dir/.html' ('..json' for '.'), which `ls` does not show. Now BAD_CONFIG naming the flag,
 * before the run, with nothing written.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { assertBadConfig, cli } from './cli_testkit.ts';

function inTempDir(fn: (dir: string) => void): void {
  const dir = mkdtempSync(join(tmpdir(), 'review-cli-trace-base-'));
  try {
    fn(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('trace: an --out without a file name is BAD_CONFIG, and no hidden .json/.html is written', () => {
  inTempDir((dir) => {
    for (const out of [`${dir}/`, join(dir, '.json'), `${dir}/.`]) {
      assertBadConfig(cli(['trace', '--out', out], 30_000), '--out');
      assert.deepEqual(readdirSync(dir), [], `--out ${out}`);
    }
  });
});

test('ab: a --trace without a file name is BAD_CONFIG before the A/B runs', () => {
  inTempDir((dir) => {
    const args = ['ab', '--model', 'llama-mini', '--requests', '1', '--max-tokens', '1', '--variant', 'none'];
    assertBadConfig(cli([...args, '--trace', `${dir}/`], 15_000), '--trace');
    assert.deepEqual(readdirSync(dir), []);
  });
});

test('trace: a plain base name still writes <base>.json and <base>.html', () => {
  inTempDir((dir) => {
    const r = cli(['trace', '--out', join(dir, 't')], 30_000);
    assert.equal(r.status, 0, r.stderr.slice(-300));
    assert.deepEqual(readdirSync(dir).sort(), ['t.html', 't.json']);
  });
});
