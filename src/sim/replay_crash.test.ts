/**
 * the replay command printed for a failure must reproduce exactly that failure. A replay is a
 * traced run that goes on after the first violation; when going on makes the engine loop crash, the
 * loop's rejection must become the world's `crash` violation, not an unhandled rejection that kills
 * the process (`handoff sim ... --replay` then dies with a stack trace and prints no report).
 * Runs the CLI in a child process: an unhandled rejection would also kill the test runner.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const bin = fileURLToPath(new URL('../../bin/handoff.mjs', import.meta.url));

function sim(args: string[]): {
  status: number | null;
  json: {
    firstFailingSeed: number | null;
    replay: string | null;
    violations: Array<{ oracle: string; invariant?: string; step: number; message: string }>;
  } | null;
  stderr: string;
} {
  const r = spawnSync(process.execPath, [bin, 'sim', ...args, '--json'], { encoding: 'utf8', timeout: 60_000 });
  let json = null;
  try {
    json = JSON.parse(r.stdout.trim().split('\n').pop() ?? '');
  } catch {
    json = null;
  }
  return { status: r.status, json, stderr: r.stderr };
}

test('replay: the printed replay command of no-await-reads (1p1d, random, seed 2) reproduces its first violation', () => {
  const run = sim([
    '--scenario',
    '1p1d',
    '--strategy',
    'random',
    '--seed',
    '2',
    '--seeds',
    '1',
    '--jobs',
    '1',
    '--mutant',
    'no-await-reads',
  ]);
  assert.equal(run.json?.firstFailingSeed, 2);
  const replay = run.json?.replay ?? '';
  assert.match(replay, /^handoff sim .* --replay$/);
  const args = replay.replace(/^handoff sim /, '').split(' ');
  const again = sim(args);
  assert.equal(again.status, 1, `replay exit status (stderr: ${again.stderr.split('\n').slice(-8).join('\n')})`);
  assert.ok(again.json !== null, 'the replay printed its report');
  const first = (v: { oracle: string; invariant?: string; step: number; message: string } | undefined) =>
    v && `${v.oracle}:${v.invariant ?? ''}@${v.step} ${v.message}`;
  assert.equal(first(again.json?.violations[0]), first(run.json?.violations[0]));
});

test('replay: traced replays of no-await-reads seeds 1-8 (random and pct) end with a report, never an unhandled rejection', () => {
  const runSim = new URL('./run_sim.ts', import.meta.url).href;
  const code = `
    const { runSeed } = await import(${JSON.stringify(runSim)});
    for (const strategy of ['random', 'pct'])
      for (let s = 1; s <= 8; s++) {
        const o = { scenario: '1p1d', strategy, mutant: 'no-await-reads' };
        const a = await runSeed(o, s, false);
        const b = await runSeed({ ...o, replay: true }, s, true);
        const f = (v) => v && v.oracle + ':' + (v.invariant ?? '') + '@' + v.step + ' ' + v.message;
        if (f(a.violations[0]) !== f(b.violations[0])) { console.log('MISMATCH', strategy, s); process.exit(3); }
      }
    console.log('OK');`;
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code], {
    encoding: 'utf8',
    timeout: 100_000,
  });
  assert.equal(r.status, 0, `child: ${r.stdout} ${r.stderr.split('\n').slice(0, 8).join('\n')}`);
  assert.match(r.stdout, /OK/);
});
