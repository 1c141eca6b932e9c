/**
 * `bench serve` starts its instances with room for the workload's longest request. The
 * default --max-model-len left out the shared prefix (shared-prefix prompts are prefix + suffix), so a
 * --prefix-len near 1024 got every request refused (errors 1/1); --target xpyd passed no --max-model-len
 * at all (1024 whatever the workload); and a workload over serve's 65536 only failed when the children
 * refused the flag (PEER_UNAVAILABLE) instead of a BAD_CONFIG before any started.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cli, type CliRun } from './cli_testkit.ts';

/** Each run starts a small deployment. */
const run = (args: string[]): CliRun => cli(args, 120_000);

function errorsOf(r: CliRun): number {
  assert.equal(r.status, 0, r.stderr.slice(-400));
  return (JSON.parse(r.stdout) as { errors: number }).errors;
}

const ONE = ['--requests', '1', '--output-len', '1', '--num-blocks', '256', '--json'];

test('bench serve --target colocated: a shared prefix longer than 1024 tokens is served, not refused', () => {
  const w = ['--workload', 'shared-prefix', '--prefixes', '1', '--prefix-len', '1100', '--prompt-len', '1'];
  assert.equal(errorsOf(run(['bench', 'serve', '--target', 'colocated', ...w, ...ONE])), 0);
});

test('bench serve --target xpyd: prompts longer than 1024 tokens are served, not refused', () => {
  const x = ['--target', 'xpyd', '--prefill', '1', '--decode', '1', '--policy', 'round-robin'];
  const w = ['--prefixes', '1', '--prefix-len', '8', '--prompt-len', '1100'];
  assert.equal(errorsOf(run(['bench', 'serve', ...x, ...w, ...ONE])), 0);
});

test('bench serve: a workload no instance can take is BAD_CONFIG before any instance starts', () => {
  const r = run(['bench', 'serve', '--target', 'colocated', '--prompt-len', '65536', ...ONE]);
  assert.equal(r.status, 1, r.stderr.slice(-400));
  assert.match(r.stderr, /handoff: BAD_CONFIG: --prefix-len \+ --prompt-len \+ --output-len/, r.stderr.slice(-400));
  assert.doesNotMatch(r.stderr, /PEER_UNAVAILABLE|internal error/, r.stderr.slice(-400));
});
