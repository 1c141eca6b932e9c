/**
 * Ctrl-C (SIGINT) in a long `handoff soak` ends the load, still runs the end checks (pages back, races)
 * on what ran, prints the summary and exits 130 (1 if a check failed): a user interrupting a long run
 * keeps its results, and the servers it started are stopped.
 *
 * Failed before: SIGINT had no handler in `soak`, so Node's default ended the process at once: exit by
 * signal, empty stdout, the run's counts and checks lost.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const BIN = fileURLToPath(new URL('../../bin/handoff.mjs', import.meta.url));

test('soak: SIGINT prints the summary of what ran (--json) with the end checks, exits 130', async () => {
  const child = spawn(
    process.execPath,
    [BIN, 'soak', '--duration-s', '600', '--concurrency', '2', '--num-blocks', '512', '--seed', '3', '--json'],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const exited = new Promise<{ code: number | null; signal: string | null }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal })),
  );
  // The first progress line comes with the first compared request.
  const start = Date.now();
  while (!/soak: [1-9]\d* requests/.test(err)) {
    assert.ok(Date.now() - start < 120_000, `no request completed in 120 s; stderr: ${err.slice(-500)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  child.kill('SIGINT');
  const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
  const { code, signal } = await exited;
  clearTimeout(timer);
  assert.equal(signal, null, `ended by ${signal}; stdout: ${JSON.stringify(out)}`);
  const r = JSON.parse(out.trim()) as {
    requests: number;
    errors: number;
    mismatches: number;
    prefillPagesBack: boolean;
    decodePagesBack: boolean;
    races: number;
    ok: boolean;
    durationS: number;
  };
  assert.ok(r.requests > 0, `requests ${r.requests}`);
  assert.ok(r.durationS < 300, `stopped early: ${r.durationS} s`);
  assert.equal(r.errors, 0, JSON.stringify(r));
  assert.equal(r.mismatches, 0);
  assert.ok(r.prefillPagesBack && r.decodePagesBack && r.races === 0, JSON.stringify(r));
  assert.equal(code, 130, `exit code; stderr: ${err.slice(-500)}`);
});
