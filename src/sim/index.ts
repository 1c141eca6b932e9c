/** The simulator's entry points for the CLI (`handoff sim`, `handoff trace`). */
export {
  runSim,
  DEFAULT_SIM_PRESET,
  defaultSeed,
  runSeed,
  formatSimReport,
  replayCommand,
  type SimOptions,
  type SimReport,
  type SimViolation,
  type SeedResult,
} from './run_sim.ts';
export { traceFiles, traceSim, writeTrace } from './trace_export.ts';
export { toChromeTrace, type SimTrace } from './trace.ts';
export { timelineHtml } from './timeline_html.ts';
export { SCENARIOS, isScenarioName, type ScenarioName } from './scenarios.ts';
export { STRATEGIES, isStrategy, type Strategy } from './explorer.ts';
export {
  runDpor,
  formatDporLine,
  DPOR_DEPTH_DEFAULT,
  DPOR_MAX_SCHEDULES_DEFAULT,
  type DporReport,
} from './dpor_run.ts';
export { BUG_ZOO } from './bug_zoo.ts';
export { FAULT_SITES } from './buggify.ts';
