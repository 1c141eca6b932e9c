/** The `handoff` command: parses arguments with commander and dispatches to subcommands. */
import { Command } from 'commander';
import { isHandoffError } from '../util/errors.ts';
import { registerCoreCommands } from './core_commands.ts';
import { registerServingCommands } from './serving_commands.ts';

export async function main(argv: string[]): Promise<void> {
  const program = new Command();
  program.name('handoff').description('Disaggregated prefill/decode serving with a race-checked KV handoff').showHelpAfterError();

  program
    .command('up')
    .description('start prefill, decode and the proxy on localhost (dsv4-mini)')
    .action(() => {
      process.stderr.write('handoff up: the serving layer is not built yet; see `handoff --help` for what is available\n');
      process.exitCode = 2;
    });

  registerCoreCommands(program);
  registerServingCommands(program);

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
