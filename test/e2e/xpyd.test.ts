/**
 * `handoff up --prefill 2 --decode 2 --policy kv-aware` as real processes on loopback: all four
 * instances and the proxy come up; requests with a shared prefix are answered; a decode SIGKILLed while
 * requests are in flight costs no request (the proxy retries what had not been answered and routes
 * around the dead one); a prefill sent SIGTERM drains (its in-flight requests finish, new ones go to the
 * other prefill) and exits; Ctrl-C then stops the rest with exit 0.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { RealEnv } from '../../src/util/env.ts';
import { HANDOFF_BIN } from '../../src/cli/children.ts';
import { alive, post } from './kit.ts';

const env = new RealEnv(17);

const SYSTEM = 'You are a careful assistant. Answer briefly and precisely, using only what the user gives you. ';

/** The proxy's requests in flight per instance URL (its /metrics). */
async function inflight(url: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = new Map<string, number>();
  for (const m of text.matchAll(/^handoff_proxy_instance_inflight\{side="\w+",url="([^"]+)"\} (\S+)$/gm))
    out.set(m[1]!, Number(m[2]));
  return out;
}

async function retries(url: string): Promise<number> {
  const m = /^handoff_proxy_retries_total (\S+)$/m.exec(await (await fetch(`${url}/metrics`)).text());
  return Number(m?.[1] ?? 0);
}

/** While `work` runs, signal the first of `targets` (url → pid) seen with a request in flight. */
async function signalBusy(
  url: string,
  targets: Map<string, number>,
  signal: NodeJS.Signals,
  work: Promise<number[]>,
): Promise<{ pid: number; statuses: number[] }> {
  let pid = -1;
  let done = false;
  void work.finally(() => (done = true));
  while (pid < 0 && !done) {
    for (const [u, n] of await inflight(url)) {
      if (n > 0 && targets.has(u) && pid < 0) {
        pid = targets.get(u)!;
        process.kill(pid, signal);
      }
    }
    await env.sleep(5);
  }
  assert.ok(pid > 0, 'an instance was busy at some point');
  return { pid, statuses: await work };
}

/** `n` requests, `concurrency` at a time; every answer's status. */
async function load(url: string, n: number, concurrency: number): Promise<number[]> {
  const statuses: number[] = [];
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < n) {
      const i = next++;
      const r = await post(url, { prompt: `${SYSTEM}Question ${i % 3}: what comes next?`, max_tokens: 8 }, 90_000);
      statuses.push(r.status);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return statuses;
}

test('2P2D with handoff up: serves, survives a killed decode, drains a stopped prefill, exits 0', async () => {
  const childEnv: NodeJS.ProcessEnv = { ...process.env, HANDOFF_LOG_LEVEL: 'warn' };
  delete childEnv['NODE_TEST_CONTEXT'];
  const args = ['up', '--port', '0', '--prefill', '2', '--decode', '2', '--policy', 'kv-aware', '--num-blocks', '256'];
  args.push('--skip-prefill-tokens', '0'); // every request takes the P/D path: both roles see traffic
  const up = spawn(process.execPath, [HANDOFF_BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: childEnv });
  const exited = new Promise<number | null>((resolve) => up.once('exit', (code) => resolve(code)));
  let out = '';
  up.stdout.setEncoding('utf8').on('data', (s: string) => (out += s));
  up.stderr.resume();
  try {
    const deadline = env.nowMs() + 120_000;
    while (!out.includes('Ctrl-C stops everything')) {
      if (env.nowMs() > deadline || up.exitCode !== null) assert.fail(`not ready: ${out}`);
      await env.sleep(50);
    }
    const pidsOf = (role: string) =>
      new Map([...out.matchAll(new RegExp(`  ${role} +(\\S+)  \\(pid (\\d+)`, 'g'))].map((m) => [m[1]!, Number(m[2])]));
    const [prefills, decodes] = [pidsOf('prefill'), pidsOf('decode')];
    assert.equal(prefills.size, 2, out);
    assert.equal(decodes.size, 2, out);
    const url = /proxy +(\S+)/.exec(out)?.[1] ?? assert.fail(out);
    assert.deepEqual(new Set(await load(url, 6, 3)), new Set([200]), 'shared-prefix requests answered');

    // A decode killed while it has a request in flight: that request is retried, none fails.
    const killed = await signalBusy(url, decodes, 'SIGKILL', load(url, 12, 3));
    assert.deepEqual(new Set(killed.statuses), new Set([200]), `answered around the dead decode: ${killed.statuses}`);
    assert.ok((await retries(url)) >= 1, 'the in-flight request was retried');
    assert.match(out, /decode \(pid \d+\) exited .*1 decode left/);

    // A prefill stopped (SIGTERM) while it has a request in flight: it drains, then exits.
    const stopped = await signalBusy(url, prefills, 'SIGTERM', load(url, 9, 3));
    assert.deepEqual(
      new Set(stopped.statuses),
      new Set([200]),
      `answered while a prefill drained: ${stopped.statuses}`,
    );
    const gone = env.nowMs() + 40_000;
    while (alive(stopped.pid) && env.nowMs() < gone) await env.sleep(50);
    assert.equal(alive(stopped.pid), false, 'the drained prefill exited');
    assert.deepEqual(new Set(await load(url, 3, 3)), new Set([200]), '1P1D left: still serving');

    up.kill('SIGINT');
    assert.equal(await exited, 0);
    for (const pid of [...prefills.values(), ...decodes.values()])
      assert.equal(alive(pid), false, `child ${pid} is gone`);
  } finally {
    if (up.exitCode === null) up.kill('SIGKILL');
  }
});
