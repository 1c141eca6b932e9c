/**
 * Child `handoff` processes (serve, proxy) for `handoff up`, the serving bench and the e2e tests. Each
 * child runs with `--json --exit-with-parent`: it prints one JSON line when ready and exits when our
 * stdin pipe to it closes, so even a parent killed with SIGKILL leaves no server behind.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { Env } from '../util/env.ts';
import { HandoffError } from '../util/errors.ts';

export const HANDOFF_BIN = fileURLToPath(new URL('../../bin/handoff.mjs', import.meta.url));

export interface ChildServer {
  /** The child's ready line. */
  ready: Record<string, unknown>;
  url: string;
  pid: number;
  child: ChildProcess;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves once the process is gone. */
  stop(graceMs?: number): Promise<void>;
  readonly exited: boolean;
}

export interface SpawnOptions {
  readyTimeoutMs?: number;
  /** Extra environment (e.g. HANDOFF_LOG_LEVEL). */
  env?: Record<string, string>;
  /** A command the child runs under, e.g. `['ip', 'netns', 'exec', 'ns1']` (it must exec node in place). */
  prefix?: string[];
  /** Aborted: give up waiting for the ready line and stop the child (a sibling failed to start). */
  signal?: AbortSignal;
}

/** Start `handoff <args> --json --exit-with-parent` and wait for its ready line. */
export function spawnHandoff(args: string[], env: Env, opts: SpawnOptions = {}): Promise<ChildServer> {
  const childEnv: NodeJS.ProcessEnv = { ...process.env, ...opts.env };
  // A child of a test run must not report to the test runner, and logs only warnings.
  if (childEnv['NODE_TEST_CONTEXT'] !== undefined) childEnv['HANDOFF_LOG_LEVEL'] ??= 'warn';
  delete childEnv['NODE_TEST_CONTEXT'];
  const argv = [process.execPath, HANDOFF_BIN, ...args, '--json', '--exit-with-parent'];
  const [cmd, ...rest] = [...(opts.prefix ?? []), ...argv] as [string, ...string[]];
  const child = spawn(cmd, rest, { stdio: ['pipe', 'pipe', 'inherit'], env: childEnv });
  let exited = false;
  const gone = new Promise<void>((resolve) => child.once('exit', () => ((exited = true), resolve())));
  const stop = async (graceMs = 5000): Promise<void> => {
    if (exited) return;
    child.kill('SIGTERM');
    const t = env.setTimer(graceMs, () => child.kill('SIGKILL'));
    await gone;
    t.cancel();
  };
  return new Promise((resolve, reject) => {
    let out = '';
    const fail = (why: string): void => {
      void stop(500);
      reject(new HandoffError('PEER_UNAVAILABLE', `handoff ${args.join(' ')}: ${why}`));
    };
    const timer = env.setTimer(opts.readyTimeoutMs ?? 60_000, () => fail('not ready in time'));
    const onExit = (code: number | null, signal: string | null): void => {
      timer.cancel();
      fail(`exited before it was ready (code ${code}, signal ${signal})`);
    };
    child.once('exit', onExit);
    child.once('error', (e) => {
      timer.cancel();
      fail(e.message);
    });
    const unsubscribe = onAborted(opts.signal, () => {
      timer.cancel();
      child.off('exit', onExit);
      fail('startup cancelled');
    });
    child.stdout?.setEncoding('utf8');
    const onData = (s: string): void => {
      out += s;
      const nl = out.indexOf('\n');
      if (nl < 0) return;
      timer.cancel();
      child.off('exit', onExit);
      unsubscribe();
      child.stdout?.off('data', onData);
      child.stdout?.resume(); // keep draining whatever else it prints
      let ready: Record<string, unknown>;
      try {
        ready = JSON.parse(out.slice(0, nl)) as Record<string, unknown>;
        // catch-ok: only JSON.parse runs in the try: a child that printed something else failed to start
      } catch {
        fail(`printed '${out.slice(0, nl)}' instead of its JSON ready line`);
        return;
      }
      resolve({
        ready,
        url: String(ready['url']),
        pid: child.pid ?? -1,
        child,
        stop,
        get exited() {
          return exited;
        },
      });
    };
    child.stdout?.on('data', onData);
  });
}

/** Call `onAbort` once `signal` aborts (at once if it already has); returns the unsubscribe. */
function onAborted(signal: AbortSignal | undefined, onAbort: () => void): () => void {
  if (signal?.aborted) {
    onAbort();
    return () => {};
  }
  signal?.addEventListener('abort', onAbort, { once: true });
  return () => signal?.removeEventListener('abort', onAbort);
}
