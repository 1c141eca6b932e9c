/**
 * The ready line `handoff up` prints quotes the API key as one shell word: a key holding a single quote
 * (or `$`, a space, a backtick) broke the printed curl command, or made the shell expand part of it. The
 * test runs the quoted words through a real shell and gets them back unchanged.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { shellQuote } from './up.ts';

test('shellQuote: any string comes back from sh as one word, unchanged', () => {
  const words = ["it's", 'a b', '$HOME', '`id`', "''", '', 'Authorization: Bearer k\'e"y$1 \\n', 'ünï'];
  const script = `for w in ${words.map(shellQuote).join(' ')}; do printf '%s\\0' "$w"; done`;
  const out = execFileSync('sh', ['-c', script], { encoding: 'utf8' });
  assert.deepEqual(out.split('\0').slice(0, -1), words);
});
