/**
 * Ctrl-C (SIGINT) in a long `handoff bench serve` prints the summary of the requests that completed and
 * exits 130, instead of dying with nothing printed: a user interrupting a long run keeps its results.
 *
 * Failed before: SIGINT had no handler in `bench serve`, so Node's default ended the process at once:
 * exit by signal, empty stdout, every completed request's timing lost.
 */
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { encode } from '../../src/model/tokenizer.ts';
import { startFake, type Fake } from '../../src/serve/scripted_server_testkit.ts';

const BIN = fileURLToPath(new URL('../../bin/handoff.mjs', import.meta.url));

let f: Fake;
before(async () => {
  f = await startFake({ maxModelLen: 4096 });
  f.script = encode(' hello world and more');
});
after(async () => f.close());

test('bench serve --url: SIGINT prints the summary of what completed (--json) and exits 130', async () => {
  const child = spawn(
    process.execPath,
    [
      BIN,
      'bench',
      'serve',
      '--url',
      f.url,
      '--requests',
      '100000',
      '--concurrency',
      '2',
      '--prompt-len',
      '8:16',
      '--output-len',
      '200:200',
      '--json',
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const exited = new Promise<{ code: number | null; signal: string | null }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal })),
  );
  // Let some requests complete (the progress bar counts them on stderr), then interrupt.
  const start = Date.now();
  while (!/[1-9]\d*\/100000/.test(err)) {
    assert.ok(Date.now() - start < 60_000, `no request completed in 60 s; stderr: ${err.slice(-500)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  child.kill('SIGINT');
  const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
  const { code, signal } = await exited;
  clearTimeout(timer);
  assert.equal(signal, null, `ended by ${signal}; stdout: ${JSON.stringify(out)}`);
  assert.equal(code, 130, `exit code; stderr: ${err.slice(-500)}`);
  const r = JSON.parse(out.trim()) as { requests: number; errors: number; tokensPerSec: number };
  assert.ok(r.requests > 0 && r.requests < 100000, `requests ${r.requests}`);
  assert.equal(r.errors, 0, 'requests cut short by the interrupt are left out, not counted as errors');
  assert.ok(r.tokensPerSec > 0);
});
