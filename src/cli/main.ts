/** The `handoff` command: parses arguments with commander and dispatches to subcommands. */
import { Command } from 'commander';
import { isHandoffError } from '../util/errors.ts';
import { registerCoreCommands } from './core_commands.ts';
import { registerServingCommands } from './serving_commands.ts';
import { registerSimCommands } from './sim_commands.ts';
import { registerSoak } from './soak.ts';

export async function main(argv: string[]): Promise<void> {
  const program = new Command();
  program.name('handoff').description('Disaggregated prefill/decode serving with a race-checked KV handoff').showHelpAfterError();

  registerCoreCommands(program);
  registerServingCommands(program);
  registerSimCommands(program);
  registerSoak(program);

  try {
    await program.parseAsync(argv);
  } catch (e) {
    if (isHandoffError(e)) {
      process.stderr.write(`handoff: ${e.code}: ${e.message}\n`);
      process.exitCode = 1;
      return;
    }
    throw e;
  }
}
