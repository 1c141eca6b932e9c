/**
 * `handoff up | tee up.log` (or `npm start | tee ...`) and Ctrl-C: the SIGINT reaches the whole process
 * group, so `tee` is gone at once and up's stdout is a pipe nobody reads. up wrote its "SIGINT: shutting
 * down" line into it, the write failed with EPIPE, and the unhandled 'error' event of process.stdout
 * crashed up with a Node stack (exit 1) before its proxy drained: the completions under way were cut
 * (connection reset) instead of answered, against README's "Ctrl-C ... stops the proxy and both children
 * and exits 0; the proxy drains first".
 *
 * This proves: with up's stdout reader gone, a group SIGINT while a completion is under way still lets
 * that completion finish (200), up exits 0 without a stack, and no child outlives it.
 * Before the fix: `Error: write EPIPE ... Unhandled 'error' event` on stderr, exit 1, the completion failed.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { RealEnv } from '../../src/util/env.ts';
import { HANDOFF_BIN } from '../../src/cli/children.ts';
import { alive } from './kit.ts';

const env = new RealEnv(31);

test('up whose stdout reader is gone: Ctrl-C still drains, exit 0, no EPIPE stack, no child left', async () => {
  const childEnv: NodeJS.ProcessEnv = { ...process.env, HANDOFF_LOG_LEVEL: 'error' };
  delete childEnv['NODE_TEST_CONTEXT'];
  // detached: its own process group, so a group SIGINT is what Ctrl-C in a terminal sends.
  const up = spawn(process.execPath, [HANDOFF_BIN, 'up', '--port', '0'], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: childEnv,
    detached: true,
  });
  const exited = new Promise<number | null>((resolve) => up.once('exit', (code) => resolve(code)));
  let out = '';
  let err = '';
  up.stdout.setEncoding('utf8').on('data', (s: string) => (out += s));
  up.stderr.setEncoding('utf8').on('data', (s: string) => (err += s));
  let pids: number[] = [];
  try {
    for (let i = 0; i < 400 && !out.includes('Ctrl-C stops everything'); i++) await env.sleep(50);
    assert.match(out, /Ctrl-C stops everything/, out);
    pids = [...out.matchAll(/\(pid (\d+)/g)].map((m) => Number(m[1]));
    const url = /Ready: OpenAI API at (\S+)\/v1/.exec(out)?.[1] ?? assert.fail(out);
    up.stdout.destroy(); // the reader of up's stdout (tee) is gone
    // A completion under way when Ctrl-C lands (long enough to still be running).
    const answer = fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'dsv4-mini', prompt: 'hello', max_tokens: 200, ignore_eos: true }),
    }).then(
      (r) => r.status,
      (e: unknown) => `failed: ${String(e)}`,
    );
    await env.sleep(300);
    process.kill(-(up.pid as number), 'SIGINT');
    const code = await exited;
    assert.equal(await answer, 200, err.slice(0, 1500));
    assert.doesNotMatch(err, /EPIPE|Unhandled 'error' event/, err.slice(0, 1500));
    assert.equal(code, 0, err.slice(0, 1500));
    for (let i = 0; i < 120 && pids.some((p) => alive(p)); i++) await env.sleep(250);
    assert.deepEqual(
      pids.filter((p) => alive(p)),
      [],
    );
  } finally {
    for (const p of pids) if (alive(p)) process.kill(p, 'SIGKILL');
    if (up.exitCode === null && up.signalCode === null) process.kill(-(up.pid as number), 'SIGKILL');
  }
});
