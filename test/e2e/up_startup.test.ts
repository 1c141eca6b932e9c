/**
 * `handoff up` interrupted while its children start (seconds here): SIGTERM makes it exit 0 and the
 * children leave by themselves (it died of the signal before, status 143); SIGKILL leaves children that
 * shut down quietly when their ready line meets the closed pipe (they crashed with an EPIPE stack on the
 * shared terminal before). Either way no child outlives it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execSync, spawn } from 'node:child_process';
import { RealEnv } from '../../src/util/env.ts';
import { HANDOFF_BIN } from '../../src/cli/children.ts';
import { alive } from './kit.ts';

const env = new RealEnv(17);
const childrenOf = (pid: number): number[] =>
  execSync(`ps -o pid= --ppid ${pid} || true`)
    .toString()
    .split('\n')
    .map(Number)
    .filter((n) => n > 0);

async function signalDuringStartup(sig: NodeJS.Signals) {
  const childEnv: NodeJS.ProcessEnv = { ...process.env };
  delete childEnv['NODE_TEST_CONTEXT'];
  const up = spawn(process.execPath, [HANDOFF_BIN, 'up', '--port', '0'], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: childEnv,
    detached: true,
  });
  let out = '';
  let err = '';
  up.stdout.setEncoding('utf8').on('data', (s: string) => (out += s));
  up.stderr.setEncoding('utf8').on('data', (s: string) => (err += s));
  const exited = new Promise<{ code: number | null; signal: string | null }>((r) =>
    up.once('exit', (code, signal) => r({ code, signal })),
  );
  let kids: number[] = [];
  try {
    for (let k = 0; k < 600 && !out.includes('starting'); k++) await env.sleep(50);
    await env.sleep(1500); // the children are spawned and still starting
    kids = childrenOf(up.pid as number).filter((p) => p !== up.pid);
    assert.ok(!out.includes('Ready'), 'the signal lands during startup');
    up.kill(sig);
    const r = await exited;
    for (let i = 0; i < 240 && kids.some((k) => alive(k)); i++) await env.sleep(250);
    return { ...r, err, kidsAlive: kids.filter((k) => alive(k)) };
  } finally {
    for (const k of kids) if (alive(k)) process.kill(k, 'SIGKILL');
    if (up.exitCode === null && up.signalCode === null) process.kill(-(up.pid as number), 'SIGKILL');
  }
}

test('SIGTERM during up’s startup: exit 0, and the children leave by themselves', async () => {
  const r = await signalDuringStartup('SIGTERM');
  assert.deepEqual({ code: r.code, signal: r.signal }, { code: 0, signal: null });
  assert.deepEqual(r.kidsAlive, []);
});

test('up SIGKILLed during startup: its children leave quietly (no EPIPE stack)', async () => {
  const r = await signalDuringStartup('SIGKILL');
  assert.deepEqual(r.kidsAlive, []);
  assert.doesNotMatch(r.err, /Unhandled 'error' event|EPIPE/, r.err.slice(0, 1500));
});
