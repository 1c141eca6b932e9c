/** Bad numeric flags and contradictory combinations are BAD_CONFIG naming the flag, before any work starts. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { HandoffError } from '../util/errors.ts';
import { blockSizeFlag, intFlag, portFlag } from './flags.ts';
import { cli, assertBadConfig } from './cli_testkit.ts';

test('sim: an empty --seed is refused, not run as seed 0', () => {
  assertBadConfig(cli(['sim', '--seeds', '1', '--seed', '', '--json']), '--seed');
});

test('ab: an empty --arrival-gap-ms / --seed is refused, not run as 0', () => {
  const base = ['ab', '--requests', '1', '--max-tokens', '1', '--variant', 'none', '--json'];
  assertBadConfig(cli([...base, '--arrival-gap-ms', '']), '--arrival-gap-ms');
  assertBadConfig(cli([...base, '--seed', ' ']), '--seed');
});

test('integer flags take plain decimal integers only (no hex, exponent, -0, Infinity)', () => {
  const names = (flag: string) => (e: unknown) =>
    e instanceof HandoffError && e.code === 'BAD_CONFIG' && e.message.includes(`--${flag}`);
  for (const bad of ['0x10', '1e3', '-0', 'Infinity', '0b1', '0o7', '5abc', '1.0e1'])
    assert.throws(() => portFlag('port', bad), names('port'), `--port ${bad}`);
  assert.throws(() => intFlag('num-blocks', '1e3', 2, 1 << 20), names('num-blocks'));
  assert.throws(() => blockSizeFlag('0x10'), names('block-size'));
  assert.throws(() => blockSizeFlag('1.6e1'), names('block-size'));
  assert.equal(portFlag('port', '8000'), 8000);
  assert.equal(intFlag('n', ' 12 ', 1, 20), 12, 'surrounding blanks are still fine');
  assert.equal(blockSizeFlag('16'), 16);
});

test('up: a bad --num-blocks is refused before any child starts', () => {
  const r = cli(['up', '--port', '0', '--num-blocks', 'abc']);
  assertBadConfig(r, '--num-blocks');
  assert.doesNotMatch(r.stdout, /starting/, 'no child was started');
});

test('up / soak: WRITE mode with a Mamba model is refused up front, naming --mode', () => {
  const up = cli(['up', '--port', '0', '--model', 'hybrid-mini', '--mode', 'write']);
  assertBadConfig(up, '--mode');
  assert.doesNotMatch(up.stdout, /starting/, 'no child was started');
  assertBadConfig(cli(['soak', '--model', 'hybrid-mini', '--mode', 'write', '--duration-s', '1']), '--mode');
});
