/**
 * `handoff trace` for simulated runs: run one seed with the recorder on and write the timeline as
 * Chrome trace-event JSON (`<base>.json`, for Perfetto / chrome://tracing / speedscope) and as a
 * self-contained HTML page (`<base>.html`).
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { assert } from '../util/assert.ts';
import { runSeed, type SeedResult, type SimOptions } from './run_sim.ts';
import { timelineHtml } from './timeline_html.ts';
import { toChromeTrace, type SimTrace } from './trace.ts';

export async function traceSim(
  o: Omit<SimOptions, 'seeds' | 'onProgress'>,
  seed: number,
): Promise<{ trace: SimTrace; result: SeedResult }> {
  const result = await runSeed(o, seed, true);
  assert(result.trace !== null, 'a traced run returns its trace');
  return { trace: result.trace, result };
}

/** The paths `writeTrace(trace, base)` writes: `<base>.json` and `<base>.html` (a .json/.html on base dropped). */
export function traceFiles(base: string): { json: string; html: string } {
  const stem = base.replace(/\.(json|html)$/, '');
  return { json: `${stem}.json`, html: `${stem}.html` };
}

/** Write `<base>.json` and `<base>.html`; returns the paths. */
export function writeTrace(trace: SimTrace, base: string): { json: string; html: string } {
  const { json, html } = traceFiles(base);
  mkdirSync(dirname(json) || '.', { recursive: true });
  writeFileSync(json, JSON.stringify(toChromeTrace(trace)));
  writeFileSync(html, timelineHtml(trace));
  return { json, html };
}
