/**
 * Proves: a throw (an assertion) in production code the simulator runs outside a choice's `apply()` (a timer
 * callback such as a grant's expiry, or an async continuation nobody awaits such as the WRITE producer's
 * floating push) is the run's 'crash' violation with its seed and a replay that reproduces it, for --jobs 1
 * and 2, the other seeds unaffected. Before: a timer's throw escaped `world.run()` (the CLI died with
 * "internal error", a seed thread's seed failed the whole run); a floating rejection was reported by Node only
 * after the seeds had run, as PASS, then killed the process (--jobs 1) or the seed thread (--jobs 2).
 * Each run is a child process: an unhandled rejection would also kill the test runner.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const runSimUrl = new URL('./run_sim.ts', import.meta.url).href;

interface Outcome {
  first: number | null;
  replay: string | null;
  failing: number[];
  crash: string;
  replayed: string;
}

function probeRun(
  kind: 'timer' | 'rejection',
  jobs: number,
): { status: number | null; out: Outcome | null; err: string } {
  const code = `
    const { runSim, runSeed } = await import(${JSON.stringify(runSimUrl)});
    const o = { scenario: '1p1d', strategy: 'random', crashProbe: { seed: 3, kind: ${JSON.stringify(kind)} } };
    const r = await runSim({ ...o, seeds: 4, jobs: ${jobs} });
    const f = (v) => v && v.oracle + '@' + v.step + ' ' + v.message;
    const again = await runSeed({ ...o, replay: true }, 3, true);
    console.log(JSON.stringify({
      first: r.firstFailingSeed,
      replay: r.replay,
      failing: [...new Set(r.violations.map((v) => v.seed))],
      crash: f(r.violations.find((v) => v.oracle === 'crash')) ?? '',
      replayed: f(again.violations[0]) ?? '',
    }));`;
  // A file, not --eval: the seed threads inherit the child's flags, and --input-type would kill them.
  const dir = mkdtempSync(join(tmpdir(), 'review-async-crash-'));
  writeFileSync(join(dir, 'probe.mjs'), code);
  const r = spawnSync(process.execPath, ['--import', 'tsx', join(dir, 'probe.mjs')], {
    encoding: 'utf8',
    timeout: 120_000,
  });
  rmSync(dir, { recursive: true, force: true });
  let out: Outcome | null = null;
  try {
    out = JSON.parse(r.stdout.trim().split('\n').pop() ?? '') as Outcome;
    // catch-ok: no report printed (the child died): out stays null and the test fails on it
  } catch {
    out = null;
  }
  return { status: r.status, out, err: r.stderr.split('\n').slice(0, 6).join('\n') };
}

for (const kind of ['timer', 'rejection'] as const)
  for (const jobs of [1, 2])
    test(`sim crash oracle: an assertion in a ${kind === 'timer' ? 'timer callback' : 'floating promise'}, --jobs ${jobs}`, () => {
      const { status, out, err } = probeRun(kind, jobs);
      assert.equal(status, 0, `the run ended with a report (stderr: ${err})`);
      assert.ok(out !== null);
      assert.equal(out.first, 3);
      assert.deepEqual(out.failing, [3], 'only the probed seed fails');
      assert.match(
        out.crash,
        /^crash@\d+ .*assertion failed: crash probe: a (timer callback|floating promise) asserts/,
      );
      assert.match(out.replay ?? '', /--seed 3 --replay$/);
      assert.equal(out.replayed, out.crash, 'the traced replay of the seed reports the same crash first');
    });
