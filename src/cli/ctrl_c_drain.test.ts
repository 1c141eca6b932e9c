/**
 * Ctrl-C of `handoff up` in a terminal: the SIGINT reaches the whole process group, so up's children got
 * it too, and each began its own drain (503 for every new completion) at the same moment as up's proxy
 * began its drain. The proxy's drain answers the completions under way, but in READ mode a completion
 * whose prefill leg was still running when Ctrl-C came needs a new request to decode afterwards: the
 * draining decode refused it and the client got a 503 OVERLOADED instead of its answer. (SIGTERM to up
 * alone worked: only Ctrl-C broke the drain README and proxy_drain.test.ts promise.) Also, up's own
 * SIGTERM to a child then was its second signal, which exits at once with code 1 (its drain cut short).
 *
 * This proves: completions sent before a group SIGINT (many long prompts, so most are still queued for
 * prefill when it lands) are all answered 200, up exits 0 and no child outlives it.
 * Before the fix: several of the completions got 503 ("the server is draining").
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { RealEnv, SeededRng } from '../util/env.ts';
import { HANDOFF_BIN } from './children.ts';

const env = new RealEnv(29);

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
    // catch-ok: ESRCH means the process is gone, which is the answer
  } catch {
    return false;
  }
}

test('Ctrl-C (group SIGINT) of up: completions under way are all answered, exit 0, no child left', async () => {
  const childEnv: NodeJS.ProcessEnv = { ...process.env, HANDOFF_LOG_LEVEL: 'error' };
  delete childEnv['NODE_TEST_CONTEXT'];
  // detached: its own process group, so a group SIGINT is what Ctrl-C in a terminal sends.
  const up = spawn(process.execPath, [HANDOFF_BIN, 'up', '--port', '0'], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: childEnv,
    detached: true,
  });
  const exited = new Promise<number | null>((resolve) => up.once('exit', (code) => resolve(code)));
  let out = '';
  up.stdout.setEncoding('utf8').on('data', (s: string) => (out += s));
  let pids: number[] = [];
  try {
    for (let i = 0; i < 400 && !out.includes('Ctrl-C stops everything'); i++) await env.sleep(50);
    assert.match(out, /Ctrl-C stops everything/, out);
    pids = [...out.matchAll(/\(pid (\d+)/g)].map((m) => Number(m[1]));
    const url = /Ready: OpenAI API at (\S+)\/v1/.exec(out)?.[1] ?? assert.fail(out);
    const rng = new SeededRng(5);
    let answered = 0;
    const statuses = Array.from({ length: 6 }, () =>
      fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: 'dsv4-mini',
          prompt: Array.from({ length: 500 }, () => 1 + rng.int(50000)),
          max_tokens: 4,
          ignore_eos: true,
        }),
        signal: AbortSignal.timeout(15_000),
      }).then(
        async (r) => (answered++, `${r.status} ${r.status === 200 ? '' : await r.text()}`),
        (e: unknown) => `failed: ${String(e)}`,
      ),
    );
    for (let i = 0; i < 400 && answered === 0; i++) await env.sleep(10);
    process.kill(-(up.pid as number), 'SIGINT'); // Ctrl-C: most completions are still waiting for prefill
    const results = await Promise.all(statuses);
    assert.deepEqual(
      results.filter((s) => !s.startsWith('200')),
      [],
      'every completion sent before Ctrl-C is answered',
    );
    assert.equal(await exited, 0);
    for (let i = 0; i < 80 && pids.some(alive); i++) await env.sleep(250);
    assert.deepEqual(pids.filter(alive), [], 'no child outlives up');
  } finally {
    if (up.exitCode === null && up.signalCode === null) process.kill(-(up.pid as number), 'SIGKILL');
    for (const p of pids) if (alive(p)) process.kill(p, 'SIGKILL');
  }
});
