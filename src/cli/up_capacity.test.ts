/**
 * `handoff up --num-blocks N` with N too small for one request of the children's max-model-len: refused
 * by `up` itself before any child starts (BAD_CONFIG naming `--num-blocks`, not `--max-model-len`, a flag
 * `up` does not have). Before: `up` printed "starting", started both children and failed only when one of
 * them refused its own flags. `handoff soak --num-blocks N` (no --max-model-len either) had the same flaw,
 * as had `bench serve`.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { assertBadConfig, cli } from './cli_testkit.ts';

test('up: --num-blocks too small for one request is refused before any child starts, naming up flags', () => {
  const r = cli(['up', '--port', '0', '--num-blocks', '10'], 30_000);
  assertBadConfig(r, '--num-blocks 10');
  assert.doesNotMatch(r.stdout, /starting/, 'no child was started');
  assert.doesNotMatch(r.stderr, /--max-model-len/, 'up has no --max-model-len flag');
});

test('up: the check uses each role block size (a larger --decode-block-size needs fewer pages)', () => {
  // dsv4-mini at 16 tokens per page needs more than 80 pages for 1024 tokens; prefill keeps 16.
  const r = cli(['up', '--port', '0', '--num-blocks', '80', '--decode-block-size', '64'], 30_000);
  assertBadConfig(r, '--num-blocks 80');
  assert.match(r.stderr, /prefill/, r.stderr.slice(-300));
  assert.doesNotMatch(r.stdout, /starting/, 'no child was started');
});

test('soak: --num-blocks too small for one request is refused before any child starts', () => {
  const r = cli(['soak', '--num-blocks', '16', '--duration-s', '1'], 30_000);
  assertBadConfig(r, '--num-blocks 16');
  assert.doesNotMatch(r.stderr, /--max-model-len|PEER_UNAVAILABLE|exited before it was ready/, 'no child was started');
});

test('bench serve: --num-blocks too small for one request of its max model length is refused before any start', () => {
  const r = cli(['bench', 'serve', '--num-blocks', '10', '--requests', '1', '--output-len', '1', '--target', 'pd']);
  assertBadConfig(r, '--num-blocks 10');
  assert.doesNotMatch(r.stderr, /PEER_UNAVAILABLE|exited before it was ready/, 'no child was started');
});
