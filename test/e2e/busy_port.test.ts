/**
 * A busy port is a clear one-line error and exit code 1, never a silent exit (issue 11 item 4):
 * `serve` of every role on a busy --port, --transfer-port or --transfer-data-port; `proxy` on a busy
 * --port; and `up` on a busy --port, which says so before it starts any child (nothing on stdout).
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import net from 'node:net';
import { RealEnv } from '../../src/util/env.ts';
import { HANDOFF_BIN } from '../../src/cli/children.ts';

const env = new RealEnv(4);
const HOST = '127.0.0.1';
let busy: net.Server;
let port = 0;

before(async () => {
  busy = net.createServer((s) => s.destroy());
  await new Promise<void>((resolve) => busy.listen(0, HOST, () => resolve()));
  port = (busy.address() as net.AddressInfo).port;
});

after(async () => {
  await new Promise<void>((resolve) => busy.close(() => resolve()));
});

/** Run `handoff <args>` to its exit; a run still going after `boundMs` is killed and fails the test. */
function run(args: string[], boundMs = 60_000): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const childEnv: NodeJS.ProcessEnv = { ...process.env, HANDOFF_LOG_LEVEL: 'error' };
  delete childEnv['NODE_TEST_CONTEXT'];
  const child = spawn(process.execPath, [HANDOFF_BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: childEnv });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (s: string) => (stdout += s));
  child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s));
  return new Promise((resolve, reject) => {
    const timer = env.setTimer(boundMs, () => {
      child.kill('SIGKILL');
      reject(new Error(`handoff ${args.join(' ')} still running after ${boundMs} ms`));
    });
    child.once('close', (code) => {
      timer.cancel();
      resolve({ code, stdout, stderr });
    });
  });
}

function assertOneLine(r: { code: number | null; stderr: string }, message: string): void {
  assert.equal(r.code, 1, `exit code 1 (stderr: ${r.stderr})`);
  assert.equal(r.stderr.trim(), `handoff: BAD_CONFIG: ${message}`, 'one line on stderr, no stack');
}

for (const role of ['both', 'prefill', 'decode'] as const) {
  test(`serve --role ${role} on a busy --port: "port P on HOST is already in use", exit 1`, async () => {
    assertOneLine(
      await run(['serve', '--role', role, '--host', HOST, '--port', String(port)]),
      `port ${port} on ${HOST} is already in use`,
    );
  });
}

test('serve on a busy --transfer-port or --transfer-data-port: which port, exit 1', async () => {
  const config = JSON.stringify({ kv_connector: 'OneSidedConnector' });
  const side = await run([
    'serve',
    '--role',
    'prefill',
    '--host',
    HOST,
    '--port',
    '0',
    '--transfer-port',
    String(port),
  ]);
  assertOneLine(side, `KV side-channel port ${port} on ${HOST} is already in use`);
  const data = await run([
    'serve',
    '--role',
    'both',
    '--host',
    HOST,
    '--port',
    '0',
    '--kv-transfer-config',
    config,
    '--transfer-data-port',
    String(port),
  ]);
  assertOneLine(data, `KV data-plane port ${port} on ${HOST} is already in use`);
});

test('proxy on a busy --port: exit 1 with the message', async () => {
  const r = await run([
    'proxy',
    '--host',
    HOST,
    '--port',
    String(port),
    '--prefill',
    'http://127.0.0.1:9',
    '--decode',
    'http://127.0.0.1:9',
  ]);
  assertOneLine(r, `port ${port} on ${HOST} is already in use`);
});

test('up on a busy --port: exit 1 with the message before any child starts', async () => {
  const r = await run(['up', '--host', HOST, '--port', String(port)]);
  assertOneLine(r, `port ${port} on ${HOST} is already in use`);
  assert.equal(r.stdout, '', 'nothing started (no "starting prefill and decode" line)');
});
