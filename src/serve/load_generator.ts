/**
 * The load generator behind `handoff bench serve` (in the style of `vllm bench serve`): seeded random
 * prompts (token ids) and output lengths (or a shared-prefix workload: each prompt is one of K shared
 * prefixes followed by its own random suffix, like system prompts or few-shot templates), sent as
 * streaming /v1/completions with ignore_eos, either a fixed number in flight (--concurrency) or Poisson
 * arrivals (--rate). Per request: TTFT = first streamed token − send; ITL = gaps between streamed
 * tokens. Reported: p50/p99 of both, output tokens per second over the whole run, and the number of
 * failed requests.
 */
import { assert, rethrowIfAssertion } from '../util/assert.ts';
import { SeededRng, type Env } from '../util/env.ts';
import { EOS_TOKEN_ID } from '../model/tokenizer.ts';
import { SseParser } from './sse.ts';

export interface LoadSpec {
  url: string;
  model: string | null;
  requests: number;
  /** Requests in flight at once; null with a rate. */
  concurrency: number | null;
  /** Poisson arrivals per second; null with a concurrency. */
  ratePerSec: number | null;
  promptLen: [number, number];
  outputLen: [number, number];
  seed: number;
  apiKey: string | null;
  /** Bound on one request. */
  timeoutMs: number;
  /** Default: random prompts of promptLen tokens. */
  workload?: Workload;
}

/** shared-prefix: prompt = one of `prefixes` shared prefixes of `prefixLen` tokens + a promptLen suffix. */
export type Workload = { kind: 'random' } | { kind: 'shared-prefix'; prefixes: number; prefixLen: number };

/** `handoff bench serve --json` (DESIGN.md §10): exactly these keys. */
export interface BenchServeResult {
  requests: number;
  ttftMsP50: number;
  ttftMsP99: number;
  itlMsP50: number;
  itlMsP99: number;
  tokensPerSec: number;
  errors: number;
}

export interface RequestOutcome {
  ok: boolean;
  ttftMs: number | null;
  itlMs: number[];
  outputTokens: number;
  error: string | null;
}

/** Linear-interpolated percentile of an ascending array; 0 when empty. */
export function percentile(sorted: readonly number[], p: number): number {
  assert(p >= 0 && p <= 100, 'percentile in [0, 100]');
  if (sorted.length === 0) return 0;
  const rank = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  const a = sorted[lo] as number;
  return a + ((sorted[hi] as number) - a) * (rank - lo);
}

/** The request bodies of a run: a pure function of the spec's seed. */
export function makeWorkload(
  spec: Pick<LoadSpec, 'requests' | 'promptLen' | 'outputLen' | 'seed' | 'workload'>,
): Array<{ prompt: number[]; maxTokens: number }> {
  const rng = new SeededRng(spec.seed);
  const between = ([lo, hi]: [number, number]): number => lo + rng.int(hi - lo + 1);
  const tokens = (n: number): number[] => Array.from({ length: n }, () => rng.int(EOS_TOKEN_ID)); // any id below EOS
  const w = spec.workload ?? { kind: 'random' };
  const prefixes = w.kind === 'shared-prefix' ? Array.from({ length: w.prefixes }, () => tokens(w.prefixLen)) : [];
  return Array.from({ length: spec.requests }, () => {
    const prefix = prefixes.length > 0 ? (prefixes[rng.int(prefixes.length)] as number[]) : [];
    const prompt = [...prefix, ...tokens(between(spec.promptLen))];
    return { prompt, maxTokens: between(spec.outputLen) };
  });
}

export function summarize(outcomes: readonly RequestOutcome[], wallMs: number): BenchServeResult {
  const ok = outcomes.filter((o) => o.ok);
  const ttft = ok.map((o) => o.ttftMs ?? 0).sort((a, b) => a - b);
  const itl = ok.flatMap((o) => o.itlMs).sort((a, b) => a - b);
  const tokens = ok.reduce((n, o) => n + o.outputTokens, 0);
  return {
    requests: outcomes.length,
    ttftMsP50: percentile(ttft, 50),
    ttftMsP99: percentile(ttft, 99),
    itlMsP50: percentile(itl, 50),
    itlMsP99: percentile(itl, 99),
    tokensPerSec: wallMs > 0 ? (tokens * 1000) / wallMs : 0,
    errors: outcomes.length - ok.length,
  };
}

/** One streaming completion, timed. Never throws: failures are outcomes. */
export async function timedCompletion(
  env: Env,
  spec: LoadSpec,
  prompt: number[],
  maxTokens: number,
  stop?: AbortSignal,
): Promise<RequestOutcome> {
  const outcome: RequestOutcome = { ok: false, ttftMs: null, itlMs: [], outputTokens: 0, error: null };
  const ac = new AbortController();
  const timer = env.setTimer(spec.timeoutMs, () => ac.abort());
  const onStop = (): void => ac.abort();
  stop?.addEventListener('abort', onStop);
  const start = env.nowMs();
  try {
    const res = await fetch(`${spec.url}/v1/completions`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        ...(spec.apiKey ? { authorization: `Bearer ${spec.apiKey}` } : {}),
      },
      body: JSON.stringify({
        ...(spec.model ? { model: spec.model } : {}),
        prompt,
        max_tokens: maxTokens,
        temperature: 0,
        ignore_eos: true,
        stream: true,
        stream_options: { include_usage: true },
      }),
      signal: ac.signal,
    });
    if (!res.ok || !res.body) {
      outcome.error = `HTTP ${res.status}: ${(await res.text()).slice(0, 200)}`;
      return outcome;
    }
    await readStream(res.body, env, start, outcome);
    outcome.ok = outcome.ttftMs !== null;
    if (!outcome.ok) outcome.error = 'no token streamed';
  } catch (e) {
    rethrowIfAssertion(e);
    outcome.error = ac.signal.aborted ? `timed out after ${spec.timeoutMs} ms` : (e as Error).message;
  } finally {
    timer.cancel();
    stop?.removeEventListener('abort', onStop);
  }
  return outcome;
}

/** The completion's SSE stream into `outcome` (TTFT, ITL, tokens); throws on an error event or a cut stream. */
async function readStream(
  body: ReadableStream<Uint8Array>,
  env: Env,
  start: number,
  outcome: RequestOutcome,
): Promise<void> {
  let last = start;
  const parser = new SseParser();
  const decoder = new TextDecoder();
  let done = false;
  let usageTokens: number | null = null;
  for await (const chunk of body) {
    for (const data of parser.push(decoder.decode(chunk as Uint8Array, { stream: true }))) {
      if (data === '[DONE]') {
        done = true;
        continue;
      }
      const ev = JSON.parse(data) as {
        choices?: unknown[];
        usage?: { completion_tokens?: number };
        error?: { message?: string };
      };
      if (ev.error) throw new Error(ev.error.message ?? 'error event');
      if (ev.usage?.completion_tokens !== undefined) usageTokens = ev.usage.completion_tokens;
      if (!ev.choices || ev.choices.length === 0) continue;
      const now = env.nowMs();
      if (outcome.ttftMs === null) outcome.ttftMs = now - start;
      else outcome.itlMs.push(now - last);
      last = now;
      outcome.outputTokens++;
    }
  }
  if (!done) throw new Error('stream ended without [DONE]');
  if (usageTokens !== null) outcome.outputTokens = usageTokens;
}

/**
 * Run the whole load; `onProgress(done, total)` after every request. `stop` (the user's Ctrl-C) ends it
 * early: no more requests start, those in flight are cut, and the result is of the completed ones only.
 */
export async function runLoad(
  spec: LoadSpec,
  env: Env,
  onProgress?: (done: number, total: number) => void,
  stop?: AbortSignal,
): Promise<{ result: BenchServeResult; outcomes: RequestOutcome[] }> {
  assert((spec.concurrency === null) !== (spec.ratePerSec === null), 'exactly one of concurrency and rate');
  const work = makeWorkload(spec);
  const outcomes: RequestOutcome[] = new Array(work.length);
  let finished = 0;
  let end: number | null = null;
  const stopped = (): boolean => stop?.aborted === true;
  const start = env.nowMs();
  const onStop = (): void => void (end ??= env.nowMs());
  stop?.addEventListener('abort', onStop);
  const runOne = async (i: number): Promise<void> => {
    const w = work[i] as { prompt: number[]; maxTokens: number };
    const outcome = await timedCompletion(env, spec, w.prompt, w.maxTokens, stop);
    if (stopped()) return; // cut short by the stop: neither a result nor an error
    outcomes[i] = outcome;
    onProgress?.(++finished, work.length);
  };
  try {
    if (spec.concurrency !== null) {
      let next = 0;
      const worker = async (): Promise<void> => {
        while (next < work.length && !stopped()) await runOne(next++);
      };
      await Promise.all(Array.from({ length: Math.min(spec.concurrency, work.length) }, worker));
    } else {
      const rate = spec.ratePerSec as number;
      const arrivals = new SeededRng(spec.seed ^ 0x5bd1e995);
      const inflight: Array<Promise<void>> = [];
      const stopping = new Promise<void>((resolve) => stop?.addEventListener('abort', () => resolve(), { once: true }));
      for (let i = 0; i < work.length && !stopped(); i++) {
        inflight.push(runOne(i));
        // Exponential inter-arrival gaps: a Poisson process of `rate` requests per second.
        if (i < work.length - 1)
          await Promise.race([env.sleep((-Math.log(1 - arrivals.next()) / rate) * 1000), stopping]);
      }
      await Promise.all(inflight);
    }
  } finally {
    stop?.removeEventListener('abort', onStop);
  }
  const done = stopped() ? outcomes.filter((o) => o !== undefined) : outcomes;
  return { result: summarize(done, (end ?? env.nowMs()) - start), outcomes: done };
}
