/**
 * Process lifecycle for long-running commands: run `stop` once on SIGINT/SIGTERM (or when the parent's
 * stdin pipe closes, for children of `handoff up` and the tests: a dead parent never leaves servers
 * behind), then exit 0. A second signal, or a stop that hangs, exits at once.
 */
import type { Env } from '../util/env.ts';

export interface ShutdownOptions {
  env: Env;
  /** Exit when stdin ends (the parent process is gone). */
  exitWithParent: boolean;
  /** Bound on `stop`. */
  stopTimeoutMs?: number;
  log?: (msg: string) => void;
}

export function onShutdown(stop: () => Promise<void>, opts: ShutdownOptions): void {
  let stopping = false;
  const run = (why: string): void => {
    if (stopping) {
      process.exit(1);
    }
    stopping = true;
    opts.log?.(`${why}: shutting down`);
    opts.env.setTimer(opts.stopTimeoutMs ?? 10_000, () => {
      opts.log?.('shutdown took too long; exiting');
      process.exit(1);
    });
    stop().then(
      () => process.exit(0),
      (e: unknown) => {
        opts.log?.(`error while shutting down: ${String(e)}`);
        process.exit(1);
      },
    );
  };
  process.on('SIGINT', () => run('SIGINT'));
  process.on('SIGTERM', () => run('SIGTERM'));
  if (opts.exitWithParent) {
    process.stdin.on('end', () => run('parent gone'));
    process.stdin.on('error', () => run('parent gone'));
    // Our stdout is the parent's pipe: a write into it once the parent is gone (EPIPE) means the same.
    process.stdout.on('error', () => run('parent gone'));
    process.stdin.resume();
  }
}
