/**
 * `handoff up` as a user runs it: one command starts prefill, decode (separate processes) and the
 * proxy, prints a URL and a curl line that works; SIGINT stops everything, the children are gone and
 * the exit code is 0. Ctrl-C reaches the whole process group (up and both children, as in a terminal),
 * and with `--log-format pretty` nothing on stderr is a raw JSON log line.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { RealEnv } from '../../src/util/env.ts';
import { HANDOFF_BIN } from '../../src/cli/children.ts';
import { alive } from './kit.ts';

const env = new RealEnv(3);

test('handoff up: ready with a working curl line; Ctrl-C stops all three, exit 0, no raw JSON logs', async () => {
  const childEnv: NodeJS.ProcessEnv = { ...process.env, HANDOFF_LOG_LEVEL: 'info' };
  delete childEnv['NODE_TEST_CONTEXT'];
  // detached: its own process group, so a group SIGINT is what Ctrl-C in a terminal sends.
  const up = spawn(process.execPath, [HANDOFF_BIN, 'up', '--port', '0', '--log-format', 'pretty'], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: childEnv,
    detached: true,
  });
  const exited = new Promise<number | null>((resolve) => up.once('exit', (code) => resolve(code)));
  let err = '';
  up.stderr.setEncoding('utf8').on('data', (s: string) => (err += s));
  let out = '';
  try {
    await new Promise<void>((resolve, reject) => {
      const timer = env.setTimer(60_000, () => reject(new Error(`not ready: ${out}`)));
      up.stdout.setEncoding('utf8');
      up.stdout.on('data', (s: string) => {
        out += s;
        if (out.includes('Ctrl-C stops everything')) {
          timer.cancel();
          resolve();
        }
      });
      void exited.then((code) => reject(new Error(`exited early (${code}): ${out}`)));
    });
    const curl = /curl -s (\S+) -H 'Content-Type: application\/json' -d '(.+)'/.exec(out);
    assert.ok(curl, `a curl line in:\n${out}`);
    const pids = [...out.matchAll(/\(pid (\d+)/g)].map((m) => Number(m[1]));
    assert.equal(pids.length, 2, 'prefill and decode pids printed');
    const r = await fetch(curl[1]!, { method: 'POST', headers: { 'content-type': 'application/json' }, body: curl[2] });
    assert.equal(r.status, 200);
    const j = (await r.json()) as {
      choices: Array<{ text: string; finish_reason: string }>;
      usage: { completion_tokens: number };
    };
    assert.equal(j.usage.completion_tokens, 16);
    process.kill(-(up.pid as number), 'SIGINT');
    assert.equal(await exited, 0);
    for (const pid of pids) assert.equal(alive(pid), false, `child ${pid} is gone`);
    const rawJson = err.split('\n').filter((l) => l.trimStart().startsWith('{'));
    assert.deepEqual(rawJson, [], `no raw JSON log lines on stderr:\n${err}`);
  } finally {
    if (up.exitCode === null) process.kill(-(up.pid as number), 'SIGKILL');
  }
});
