#!/usr/bin/env node
// Entry point: load TypeScript through tsx, then run the CLI.
import { register } from 'tsx/esm/api';

register();
const { main } = await import('../src/cli/main.ts');
await main(process.argv);
