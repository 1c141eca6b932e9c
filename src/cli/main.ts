/**
 * The `handoff` command: parses arguments with commander and dispatches to subcommands.
 *
 * Exit codes: an action that throws a HandoffError (bad flags, a busy port, a peer gone) prints one
 * line `handoff: CODE: message` and exits 1; anything else is a bug and prints its stack (exit 1).
 * A command that succeeds sets its own exit code (e.g. `handoff ab` gating) or keeps serving.
 */
import { Command } from 'commander';
import { RealEnv } from '../util/env.ts';
import { isHandoffError } from '../util/errors.ts';
import { registerCoreCommands } from './core_commands.ts';
import { registerServingCommands } from './serving_commands.ts';
import { registerSimCommands } from './sim_commands.ts';
import { registerSoak } from './soak.ts';

/** Longest delay a Node timer takes (~24.8 days). */
const KEEP_ALIVE_MS = 2 ** 31 - 1;

/** Run the command line; resolves with 0 once the action finished (servers keep running), 1 when it failed. */
export function main(argv: string[]): Promise<number> {
  const program = new Command();
  program
    .name('handoff')
    .description('Disaggregated prefill/decode serving with a race-checked KV handoff')
    .showHelpAfterError();

  registerCoreCommands(program);
  registerServingCommands(program);
  registerSimCommands(program);
  registerSoak(program);
  return runCommand(program, argv);
}

/** Parse `argv` and run the chosen action: 0 once it finished, 1 (message on stderr) when it threw. */
export async function runCommand(program: Command, argv: string[]): Promise<number> {
  // Hold the event loop open until the action settles: an action whose cleanup awaits only unref'd
  // handles (an idle worker thread being terminated) would otherwise let the loop empty, and Node
  // exits 13 on the unsettled promise without ever printing the error.
  const keepAlive = new RealEnv().setTimer(KEEP_ALIVE_MS, () => {});
  try {
    await program.parseAsync(argv);
    return 0;
    // catch-ok: the top-level handler: prints the error (the stack for a bug) and exits 1
  } catch (e) {
    process.stderr.write(failureMessage(e));
    return 1;
  } finally {
    keepAlive.cancel();
  }
}

/** What a failed command prints: one line for an operating error, the stack for a bug. */
export function failureMessage(e: unknown): string {
  if (isHandoffError(e)) return `handoff: ${e.code}: ${e.message}\n`;
  const detail = e instanceof Error ? (e.stack ?? `${e.name}: ${e.message}`) : String(e);
  return `handoff: internal error (a bug, please report it):\n${detail}\n`;
}
