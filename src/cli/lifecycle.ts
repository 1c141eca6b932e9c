/**
 * Process lifecycle for long-running commands: run `stop` once on SIGINT/SIGTERM (or when the parent's
 * stdin pipe closes, for children of `handoff up` and the tests: a dead parent never leaves servers
 * behind), then exit 0. A second signal, or a stop that hangs, exits at once. A managed child
 * (`exitWithParent`) ignores SIGINT: its parent stops it.
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
  process.on('SIGTERM', () => run('SIGTERM'));
  if (!opts.exitWithParent) {
    process.on('SIGINT', () => run('SIGINT'));
    return;
  }
  // A managed child leaves its shutdown to its parent (SIGTERM, or the parent gone). Ctrl-C in a terminal
  // reaches the whole process group: a child draining by itself at once refused the decode legs of the
  // completions its parent's proxy was still draining (503s), and the parent's SIGTERM was then a second
  // signal that cut the child's drain short.
  process.on('SIGINT', () => opts.log?.('SIGINT: left to the parent'));
  process.stdin.on('end', () => run('parent gone'));
  process.stdin.on('error', () => run('parent gone'));
  // Our stdout is the parent's pipe: a write into it once the parent is gone (EPIPE) means the same.
  process.stdout.on('error', () => run('parent gone'));
  process.stdin.resume();
}

/**
 * The user's Ctrl-C as a signal: a load stops and its summary is of what completed (exit code 130, unless
 * the caller sets a worse one). A second Ctrl-C is Node's default, out at once. The servers such a
 * command started ignore SIGINT: it stops them.
 */
export function interruptOnSigint(note: string): AbortSignal {
  const interrupt = new AbortController();
  process.once('SIGINT', () => {
    process.stderr.write(`\n${note}\n`);
    process.exitCode = 130;
    interrupt.abort();
  });
  return interrupt.signal;
}
