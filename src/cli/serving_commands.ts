/**
 * The serving commands: `serve`, `proxy`, `bench serve`, and the `up` entry (`npm start`), whose
 * command main.ts declares and whose flags and action are set here.
 */
import type { Command } from 'commander';
import { registerBenchServe } from './bench_serve.ts';
import { registerProxy } from './proxy.ts';
import { registerServe } from './serve.ts';
import { configureUp } from './up.ts';

export function registerServingCommands(program: Command): void {
  registerServe(program);
  registerProxy(program);
  configureUp(program.command('up').description('start prefill, decode and the proxy on localhost (dsv4-mini)'));
  registerBenchServe(program);
}
