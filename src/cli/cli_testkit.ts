/** Runs `bin/handoff.mjs` as a subprocess for the CLI's tests (logs at error level, stdin closed). */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

export interface CliRun {
  /** null: still running when `timeoutMs` ran out (killed). */
  status: number | null;
  stdout: string;
  stderr: string;
}

export function cli(args: string[], timeoutMs = 60_000): CliRun {
  const r = spawnSync(process.execPath, ['bin/handoff.mjs', ...args], {
    cwd: ROOT,
    encoding: 'utf8',
    timeout: timeoutMs,
    input: '',
    env: { ...process.env, HANDOFF_LOG_LEVEL: 'error' },
  });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Exit 1 with one `handoff: BAD_CONFIG: ... <flag>` line; no stack, no other code. */
export function assertBadConfig(r: CliRun, flag: string): void {
  assert.equal(r.status, 1, `exit 1; stdout: ${r.stdout.slice(0, 300)} stderr: ${r.stderr.slice(-300)}`);
  assert.match(r.stderr, new RegExp(`handoff: BAD_CONFIG: .*${flag}`), r.stderr.slice(-300));
  assert.doesNotMatch(r.stderr, /internal error|PEER_UNAVAILABLE/, r.stderr);
}
