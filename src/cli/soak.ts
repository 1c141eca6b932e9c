/**
 * `handoff soak`: the reliability run of issue 8. Starts prefill + decode (race checker on) + proxy and a
 * colocated server, sends seeded requests through the proxy at a fixed concurrency for `--duration-s`,
 * sends each one to the colocated server too and compares the token ids, then checks that both sides
 * got every page back (/metrics) and that the race checkers found nothing. Exit 1 on any error,
 * mismatch, leak or race. With `--abort-rate p` a drawn share of the P/D requests is abandoned by its
 * client after a drawn delay (0-400 ms: before prefill, during the transfer, during decode): those are
 * not compared, and every check above still holds for the rest and for the pages.
 */
import { interruptOnSigint } from './lifecycle.ts';
import type { Command } from 'commander';
import { rethrowIfAssertion } from '../util/assert.ts';
import { RealEnv, SeededRng, type Env } from '../util/env.ts';
import { createLogger } from '../util/log.ts';
import { spawnHandoff } from './children.ts';
import { serveArgs, startLocalCluster } from './cluster.ts';
import { intFlag, modeFlag, numberFlag, presetFlag } from './flags.ts';
import { checkNumBlocksHoldARequest } from './up.ts';

export interface SoakResult {
  durationS: number;
  requests: number;
  /** Requests whose client went away on purpose (`abortRate`): neither compared nor counted as errors. */
  aborted: number;
  errors: number;
  mismatches: number;
  outputTokens: number;
  tokensPerSec: number;
  prefillPagesBack: boolean;
  decodePagesBack: boolean;
  races: number;
  firstProblem: string | null;
}

async function metrics(url: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || line.trim() === '') continue;
    const sp = line.lastIndexOf(' ');
    const name = line.slice(0, sp).replace(/\{.*$/, '');
    m.set(name, (m.get(name) ?? 0) + Number(line.slice(sp + 1)));
  }
  return m;
}

async function completion(url: string, body: Record<string, unknown>, signal?: AbortSignal): Promise<number[]> {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    ...(signal ? { signal } : {}),
  });
  const json = (await res.json()) as {
    choices?: Array<{ token_ids?: number[] }>;
    error?: { code?: string; message?: string };
  };
  if (!res.ok || !json.choices?.[0]?.token_ids)
    throw new Error(`HTTP ${res.status} ${json.error?.code ?? ''} ${json.error?.message ?? ''}`.trim());
  return json.choices[0].token_ids;
}

async function pagesBack(url: string, env: Env, timeoutMs: number): Promise<boolean> {
  const deadline = env.nowMs() + timeoutMs;
  for (;;) {
    const m = await metrics(url);
    if (m.get('handoff_kv_free_pages') === m.get('handoff_kv_total_pages')) return true;
    if (env.nowMs() > deadline) return false;
    await env.sleep(200);
  }
}

interface SoakTally {
  requests: number;
  aborted: number;
  errors: number;
  mismatches: number;
  outputTokens: number;
  firstProblem: string | null;
}

/** One seeded completion request (its prompt, length, temperature and seed drawn from rng). */
function soakRequestBody(rng: SeededRng, model: string): Record<string, unknown> {
  const len = 8 + rng.int(200);
  return {
    model,
    prompt: Array.from({ length: len }, () => 1 + rng.int(50000)),
    max_tokens: 4 + rng.int(28),
    temperature: rng.int(2) === 0 ? 0 : 0.8,
    seed: rng.int(1 << 30),
    ignore_eos: true,
    return_token_ids: true,
  };
}

/**
 * `concurrency` workers send seeded requests through the proxy (`pdUrl`) and to the colocated server
 * (`refUrl`) until the deadline, comparing the token ids.
 */
async function driveSoakLoad(
  o: { preset: string; concurrency: number; seed: number; abortRate: number },
  urls: { pdUrl: string; refUrl: string },
  env: Env,
  deadline: number,
  onProgress?: (done: number, errors: number, mismatches: number) => void,
  stop?: AbortSignal,
): Promise<SoakTally> {
  const rng = new SeededRng(o.seed);
  const tally: SoakTally = { requests: 0, aborted: 0, errors: 0, mismatches: 0, outputTokens: 0, firstProblem: null };
  const worker = async (): Promise<void> => {
    while (env.nowMs() < deadline && stop?.aborted !== true) {
      const body = soakRequestBody(rng, o.preset);
      tally.requests++;
      // Drawn only with aborts on, so a seed's workload without them is the one it always was.
      if (o.abortRate > 0 && rng.int(1000) < o.abortRate * 1000) {
        await abandoned(urls.pdUrl, body, rng.int(400), env);
        tally.aborted++;
        continue;
      }
      try {
        const [pd, ref] = await Promise.all([completion(urls.pdUrl, body), completion(urls.refUrl, body)]);
        tally.outputTokens += pd.length;
        if (pd.join(',') !== ref.join(',')) {
          tally.mismatches++;
          tally.firstProblem ??= `request ${tally.requests}: P/D tokens ${pd.slice(0, 6).join(',')}… differ from colocated ${ref.slice(0, 6).join(',')}…`;
        }
      } catch (e) {
        rethrowIfAssertion(e);
        tally.errors++;
        tally.firstProblem ??= `request ${tally.requests}: ${(e as Error).message}`;
      }
      onProgress?.(tally.requests, tally.errors, tally.mismatches);
    }
  };
  await Promise.all(Array.from({ length: o.concurrency }, worker));
  return tally;
}

/** A P/D request whose client goes away after `afterMs` (unless it was answered first). */
async function abandoned(url: string, body: Record<string, unknown>, afterMs: number, env: Env): Promise<void> {
  const client = new AbortController();
  const answered = completion(url, body, client.signal).then(
    () => undefined,
    (e: unknown) => rethrowIfAssertion(e), // catch-ok: aborted by us, or failed on its way out: not compared
  );
  await Promise.race([answered, env.sleep(afterMs)]);
  client.abort();
  await answered;
}

/** After the load: did both sides get every page back, and how many races did their checkers find. */
async function checkSoakCluster(
  urls: { prefillUrl: string; decodeUrl: string },
  env: Env,
): Promise<{ prefillPagesBack: boolean; decodePagesBack: boolean; races: number }> {
  const [prefillPagesBack, decodePagesBack] = await Promise.all([
    pagesBack(urls.prefillUrl, env, 30_000),
    pagesBack(urls.decodeUrl, env, 30_000),
  ]);
  const races =
    ((await metrics(urls.decodeUrl)).get('handoff_races_total') ?? 0) +
    ((await metrics(urls.prefillUrl)).get('handoff_races_total') ?? 0);
  return { prefillPagesBack, decodePagesBack, races };
}

export async function runSoak(
  o: {
    preset: ReturnType<typeof presetFlag>;
    mode: 'read' | 'write';
    durationS: number;
    concurrency: number;
    numBlocks: number;
    seed: number;
    /** Share of P/D requests abandoned by their client (0 to 1; default 0). */
    abortRate?: number;
  },
  env: Env,
  onProgress?: (done: number, errors: number, mismatches: number) => void,
  /** The user's Ctrl-C: no new request starts; those in flight finish and the end checks still run. */
  stop?: AbortSignal,
): Promise<SoakResult> {
  const common = {
    preset: o.preset,
    mode: o.mode,
    host: '127.0.0.1',
    serveArgs: ['--num-blocks', String(o.numBlocks), '--race-check'],
  };
  const cluster = await startLocalCluster(
    { ...common, proxyPort: 0, log: createLogger('soak', 'warn'), childLogLevel: 'warn' },
    env,
  );
  let colocated: Awaited<ReturnType<typeof spawnHandoff>>;
  try {
    colocated = await spawnHandoff(
      serveArgs('both', { ...common, serveArgs: ['--num-blocks', String(o.numBlocks)] }),
      env,
      { env: { HANDOFF_LOG_LEVEL: 'warn' } },
    );
  } catch (e) {
    await cluster.stop(); // the colocated server did not start: nothing of the soak may outlive it
    throw e;
  }
  const t0 = env.nowMs();
  const deadline = t0 + o.durationS * 1000;
  try {
    const urls = { pdUrl: cluster.proxyUrl, refUrl: colocated.url };
    const tally = await driveSoakLoad({ ...o, abortRate: o.abortRate ?? 0 }, urls, env, deadline, onProgress, stop);
    const elapsedS = (env.nowMs() - t0) / 1000;
    const checks = await checkSoakCluster({ prefillUrl: cluster.prefill.url, decodeUrl: cluster.decode.url }, env);
    return {
      durationS: elapsedS,
      requests: tally.requests,
      aborted: tally.aborted,
      errors: tally.errors,
      mismatches: tally.mismatches,
      outputTokens: tally.outputTokens,
      tokensPerSec: tally.outputTokens / elapsedS,
      ...checks,
      firstProblem: tally.firstProblem,
    };
  } finally {
    await Promise.all([cluster.stop(), colocated.stop()]);
  }
}

export function registerSoak(program: Command): void {
  program
    .command('soak')
    .description(
      'reliability run: load through the P/D proxy vs colocated for N seconds; errors, mismatches, leaked pages, races',
    )
    .option('--model <preset>', 'model preset', 'dsv4-mini')
    .option('--mode <mode>', 'read | write', 'read')
    .option('--duration-s <n>', 'seconds of load', '180')
    .option('--concurrency <n>', 'requests in flight', '16')
    .option('--num-blocks <n>', 'KV pages per instance', '1024')
    .option('--seed <n>', 'workload seed', '0')
    .option('--abort-rate <p>', 'share of P/D requests whose client goes away after 0-400 ms (0 to 1)', '0')
    .option('--json', 'print one JSON object')
    .action(async (opts: Record<string, string | boolean | undefined>) => {
      const env = new RealEnv();
      let lastPrint = 0;
      const preset = presetFlag(opts['model']);
      const numBlocks = intFlag('num-blocks', opts['numBlocks'], 16, 1 << 20);
      checkNumBlocksHoldARequest(preset, numBlocks, { prefill: undefined, decode: undefined });
      // Ctrl-C: the load ends, the end checks still run on what ran.
      const interrupt = interruptOnSigint('soak: interrupted; checking and summing up what ran');
      const r = await runSoak(
        {
          preset,
          mode: modeFlag(preset, opts['mode']),
          durationS: intFlag('duration-s', opts['durationS'], 1, 86_400),
          concurrency: intFlag('concurrency', opts['concurrency'], 1, 1024),
          numBlocks,
          seed: intFlag('seed', opts['seed'], 0, 2 ** 31),
          abortRate: numberFlag('abort-rate', opts['abortRate'], 0, 1),
        },
        env,
        (done, errors, mismatches) => {
          if (env.nowMs() - lastPrint < 5000) return;
          lastPrint = env.nowMs();
          process.stderr.write(`soak: ${done} requests, ${errors} errors, ${mismatches} mismatches\n`);
        },
        interrupt,
      );
      const ok = r.errors === 0 && r.mismatches === 0 && r.prefillPagesBack && r.decodePagesBack && r.races === 0;
      if (opts['json']) process.stdout.write(`${JSON.stringify({ ...r, ok })}\n`);
      else
        process.stdout.write(
          `soak ${ok ? 'PASS' : 'FAIL'}${interrupt.aborted ? ' (interrupted)' : ''}: ${r.requests} requests (${r.aborted} abandoned) in ${r.durationS.toFixed(0)} s, ${r.errors} errors, ${r.mismatches} P/D≠colocated, ` +
            `pages back: prefill ${r.prefillPagesBack} decode ${r.decodePagesBack}, races ${r.races}, ${r.tokensPerSec.toFixed(1)} output tok/s` +
            `${r.firstProblem ? `\n  first problem: ${r.firstProblem}` : ''}\n`,
        );
      if (!ok) process.exitCode = 1;
    });
}
