/**
 * A child of `handoff up` that dies after its ready line but before up is ready (prefill crashed while
 * decode was still loading its model): nothing watched the children between their ready lines and
 * superviseChildren, so up went on to wait for the dead instance's /health for the whole 60 s readiness
 * bound and then failed with "instances not healthy after 60000 ms (...: ECONNREFUSED)", never saying
 * that the prefill process had exited; one that died after the health wait (during proxy.start) was never
 * noticed at all (its exit event had already fired), leaving a half-dead system answering 5xx forever.
 *
 * This proves: decode is held (SIGSTOP) while it starts, prefill is SIGKILLed once it listens, decode is
 * let go; up then exits 1 promptly naming the prefill's exit, and no child is left behind.
 * Before the fix: up was still waiting for /health 15 s later (the test's bound).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execSync, spawn } from 'node:child_process';
import { RealEnv } from '../util/env.ts';
import { HANDOFF_BIN } from './children.ts';

const env = new RealEnv(31);

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
    // catch-ok: ESRCH means the process is gone, which is the answer
  } catch {
    return false;
  }
}

/** The `handoff serve --role <role>` child of `parent`, or 0. */
function childWithRole(parent: number, role: string): number {
  const lines = execSync(`ps -o pid=,args= --ppid ${parent} || true`).toString().split('\n');
  const line = lines.find((l) => l.includes(`--role ${role}`));
  return line ? Number(line.trim().split(/\s+/)[0]) : 0;
}

/** Whether `pid` listens on its side channel, data port and HTTP port (HTTP is last: its ready line follows). */
const listening = (pid: number): boolean =>
  execSync('ss -ltnpH')
    .toString()
    .split('\n')
    .filter((l) => l.includes(`pid=${pid},`)).length >= 3;

test('up: prefill dies after its ready line while decode still starts: exit 1 naming it, promptly', async () => {
  const childEnv: NodeJS.ProcessEnv = { ...process.env, HANDOFF_LOG_LEVEL: 'error' };
  delete childEnv['NODE_TEST_CONTEXT'];
  const up = spawn(process.execPath, [HANDOFF_BIN, 'up', '--port', '0'], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: childEnv,
    detached: true,
  });
  let out = '';
  up.stdout.setEncoding('utf8').on('data', (s: string) => (out += s));
  up.stderr.setEncoding('utf8').on('data', (s: string) => (out += s));
  const exited = new Promise<number | null>((resolve) => up.once('exit', (code) => resolve(code)));
  let decode = 0;
  let prefill = 0;
  try {
    for (let i = 0; i < 2000 && (decode === 0 || prefill === 0); i++) {
      decode ||= childWithRole(up.pid as number, 'decode');
      prefill ||= childWithRole(up.pid as number, 'prefill');
      if (decode === 0) await env.sleep(5);
    }
    assert.ok(decode > 0 && prefill > 0, `both children started: ${out}`);
    process.kill(decode, 'SIGSTOP');
    for (let i = 0; i < 300 && !listening(prefill); i++) await env.sleep(50);
    assert.ok(listening(prefill), 'prefill is listening');
    await env.sleep(500); // its ready line is out
    process.kill(prefill, 'SIGKILL');
    await env.sleep(300);
    process.kill(decode, 'SIGCONT');
    let bound = { cancel: () => {} };
    const late = new Promise<'still running'>((r) => (bound = env.setTimer(15_000, () => r('still running'))));
    const code = await Promise.race([exited, late]);
    bound.cancel();
    assert.equal(code, 1, `up exits 1 once a child died during startup:\n${out}`);
    assert.match(out, /prefill.*exited.*SIGKILL/, out);
    for (let i = 0; i < 40 && alive(decode); i++) await env.sleep(250);
    assert.equal(alive(decode), false, 'decode does not outlive up');
  } finally {
    if (decode > 0 && alive(decode)) process.kill(decode, 'SIGCONT');
    if (up.exitCode === null && up.signalCode === null) process.kill(-(up.pid as number), 'SIGKILL');
    for (const p of [decode, prefill]) if (p > 0 && alive(p)) process.kill(p, 'SIGKILL');
  }
});
