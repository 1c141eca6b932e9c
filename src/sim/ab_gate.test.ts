/**
 * The verdict of `handoff ab` (issue 11 item 12): a mismatch or race in a variant with the fix fails
 * it (exit 1); corruption in the buggy variants is the expected contrast and never does; with only
 * buggy variants chosen nothing gates. One small real run through the CLI checks the wiring.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { abVerdict, type AbGateInput } from './ab_gate.ts';

const HANDOFF_BIN = fileURLToPath(new URL('../../bin/handoff.mjs', import.meta.url));

const v = (
  name: string,
  zeroExclusion: AbGateInput['zeroExclusion'],
  mismatchedRequests = 0,
  races = 0,
): AbGateInput => ({ name, zeroExclusion, mismatchedRequests, races });
const buggy = [v('none', 'none', 5, 40), v('mamba-only', 'mamba-only', 3, 12)];

test('all four variants, buggy ones corrupt, fixes clean: pass, gated by both fix variants', () => {
  const r = abVerdict([
    ...buggy,
    v('all-read-groups', 'all-read-groups'),
    v('all-read-groups+syncBeforeRead', 'all-read-groups'),
  ]);
  assert.equal(r.ok, true);
  assert.deepEqual(r.gating, ['all-read-groups', 'all-read-groups+syncBeforeRead']);
  assert.deepEqual(r.failures, []);
  assert.match(r.summary, /^gate: pass/);
});

test('one mismatch in all-read-groups fails the A/B and says which variant and why', () => {
  const r = abVerdict([...buggy, v('all-read-groups', 'all-read-groups', 1, 0)]);
  assert.equal(r.ok, false);
  assert.deepEqual(r.failures, ['all-read-groups: 1 mismatched request(s), 0 race(s)']);
  assert.match(r.summary, /^gate: FAIL.*all-read-groups: 1 mismatched/);
});

test('a race with every request matching still fails (the race checker sees what tokens may hide)', () => {
  assert.equal(abVerdict([v('all-read-groups', 'all-read-groups', 0, 1)]).ok, false);
});

test('the syncBeforeRead fix variant gates on its own when it is the only fix chosen', () => {
  const r = abVerdict([v('none', 'none', 2, 3), v('all-read-groups+syncBeforeRead', 'all-read-groups', 0, 2)]);
  assert.equal(r.ok, false);
  assert.deepEqual(r.gating, ['all-read-groups+syncBeforeRead']);
});

test('a fix variant whose READ failed and was recomputed fails the gate even though its tokens match', () => {
  const r = abVerdict([{ ...v('all-read-groups', 'all-read-groups'), loadFailures: 2 }]);
  assert.equal(r.ok, false);
  assert.deepEqual(r.failures, [
    'all-read-groups: 0 mismatched request(s), 0 race(s), 2 load failure(s) recomputed locally',
  ]);
});

test('only buggy variants chosen: nothing gates, corruption does not fail, and the summary says so', () => {
  const r = abVerdict(buggy);
  assert.equal(r.ok, true);
  assert.deepEqual(r.gating, []);
  assert.match(r.summary, /gate: none/);
});

test('CLI: a small real A/B (prefill 8, decode 32 tokens per page) exits 0 with the verdict in its JSON; the buggy variant races without failing it', () => {
  const env: NodeJS.ProcessEnv = { ...process.env, HANDOFF_LOG_LEVEL: 'error' };
  delete env['NODE_TEST_CONTEXT'];
  const args = [
    'ab',
    '--model',
    'dsv4-mini',
    '--requests',
    '6',
    '--max-tokens',
    '4',
    '--seed',
    '2',
    '--arrival-gap-ms',
    '2',
    '--variant',
    'none,all-read-groups',
    '--prefill-block-size',
    '8',
    '--decode-block-size',
    '32',
    '--json',
  ];
  const r = spawnSync(process.execPath, [HANDOFF_BIN, ...args], { encoding: 'utf8', env, timeout: 120_000 });
  assert.equal(r.status, 0, `exit code (stderr: ${r.stderr.slice(-2000)})`);
  const report = JSON.parse(r.stdout) as {
    prefillBlockSize: number;
    decodeBlockSize: number;
    gate: { ok: boolean; gating: string[] };
    variants: Array<{ name: string; races: number }>;
  };
  assert.deepEqual([report.prefillBlockSize, report.decodeBlockSize], [8, 32]);
  assert.deepEqual(report.gate.gating, ['all-read-groups']);
  assert.equal(report.gate.ok, true);
  assert.ok(
    (report.variants.find((x) => x.name === 'none')?.races ?? 0) > 0,
    'the buggy variant raced (found from happens-before, not timing)',
  );
});
