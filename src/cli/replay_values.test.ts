/**
 * Values of replay lines and load targets are parsed strictly. A tampered `--schedule`
 * ('0..1', '1e0', '0x1', ' 1') ran some other schedule instead of BAD_CONFIG (Number('') is 0, Number
 * takes exponents, hex and blanks); `bench serve --url notaurl` ran, counted every request an error and
 * exited 0 instead of refusing the flag.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cli, assertBadConfig } from './cli_testkit.ts';

test('sim --replay: a malformed --schedule is refused, not run as another schedule', () => {
  for (const schedule of ['0..1', '1e0', '0x1', ' 1', '1.', '01'])
    assertBadConfig(
      cli(['sim', '--strategy', 'dpor', '--replay', '--seed', '0', '--schedule', schedule]),
      '--schedule',
    );
});

test('sim: --schedule without --replay, or with another strategy, is refused (it was ignored: a full search ran)', () => {
  assertBadConfig(cli(['sim', '--strategy', 'dpor', '--seed', '0', '--schedule', '0.1']), '--schedule');
  assertBadConfig(cli(['sim', '--strategy', 'random', '--replay', '--seed', '1', '--schedule', '0.1']), '--schedule');
  assertBadConfig(
    cli(['trace', '--strategy', 'pct', '--schedule', '0.1', '--out', '/tmp/handoff-never']),
    '--schedule',
  );
});

test('sim --replay: a well-formed --schedule still replays', () => {
  const r = cli(['sim', '--strategy', 'dpor', '--replay', '--seed', '0', '--no-faults', '--schedule', '0.1', '--json']);
  assert.equal(r.status, 0, r.stderr.slice(-300));
  assert.equal((JSON.parse(r.stdout) as { seeds: number }).seeds, 1);
});

test('bench serve: an --url that is not an http(s) URL is BAD_CONFIG, not a run of errors that exits 0', () => {
  for (const url of ['notaurl', 'ftp://127.0.0.1:1', ''])
    assertBadConfig(cli(['bench', 'serve', '--url', url, '--requests', '1', '--json']), '--url');
});
