#!/usr/bin/env node
// Entry point: load TypeScript through tsx, then run the CLI.
import { register } from 'tsx/esm/api';

register();
const { main } = await import('../src/cli/main.ts');
const code = await main(process.argv);
// A failed command exits now (its message is already written), even if it left a socket or thread open.
if (code !== 0) process.exit(code);
