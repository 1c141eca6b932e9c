/**
 * The CLI's error path (issue 11 item 4): an action that fails after awaiting only unref'd handles
 * (as `serve` did while terminating its idle compute thread) still prints its error and exits 1,
 * instead of Node exiting 13 on an emptied event loop with nothing printed. A HandoffError is one
 * line without a stack; any other error is a bug and prints its stack.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { HandoffError } from '../util/errors.ts';
import { failureMessage } from './main.ts';

const MAIN_URL = new URL('./main.ts', import.meta.url).href;
const ERRORS_URL = new URL('../util/errors.ts', import.meta.url).href;

/**
 * A one-command program run the way bin/handoff.mjs runs main: its action waits on an unref'd timer, then throws
 * `throwExpr`.
 */
function runFailingAction(throwExpr: string): { status: number | null; stderr: string } {
  const script = `
    import { Command } from 'commander';
    import { runCommand } from ${JSON.stringify(MAIN_URL)};
    import { HandoffError } from ${JSON.stringify(ERRORS_URL)};
    const program = new Command().name('handoff');
    program.command('fail').action(async () => {
      await new Promise((resolve) => setTimeout(resolve, 50).unref());
      throw ${throwExpr};
    });
    const code = await runCommand(program, [process.argv[0], 'handoff', 'fail']);
    if (code !== 0) process.exit(code);
  `;
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
    encoding: 'utf8',
    timeout: 30_000,
  });
  return { status: r.status, stderr: r.stderr };
}

test("an action that fails after awaiting only unref'd handles prints one line and exits 1 (not 13, not silent)", () => {
  const r = runFailingAction(`new HandoffError('BAD_CONFIG', 'port 8000 on 127.0.0.1 is already in use')`);
  assert.equal(r.status, 1, `exit code (stderr: ${r.stderr})`);
  assert.equal(r.stderr, 'handoff: BAD_CONFIG: port 8000 on 127.0.0.1 is already in use\n');
});

test('a programmer error in an action prints its stack and exits 1', () => {
  const r = runFailingAction(`new TypeError('boom')`);
  assert.equal(r.status, 1, `exit code (stderr: ${r.stderr})`);
  assert.match(r.stderr, /internal error/);
  assert.match(r.stderr, /TypeError: boom\n\s+at /, 'the stack is printed');
});

test('failureMessage: a HandoffError is one line with its code; anything else carries its stack', () => {
  assert.equal(failureMessage(new HandoffError('PEER_UNAVAILABLE', 'gone')), 'handoff: PEER_UNAVAILABLE: gone\n');
  const bug = failureMessage(new RangeError('off by one'));
  assert.match(bug, /RangeError: off by one\n\s+at /);
  assert.equal(failureMessage('plain string').includes('plain string'), true);
});
