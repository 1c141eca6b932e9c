/**
 * A serving process at --tensor-parallel-size 2 whose rank 1 compute thread dies mid-request (in a child process,
 * as `handoff serve` runs): the request gets a 500 OpenAI error naming the thread's exit, /health answers 503 with
 * that reason and a later request a 500, the process keeps answering, and after its shutdown (drainAndClose, what
 * SIGTERM runs) it exits on its own: no unhandled rejection, no rank thread left keeping it alive. Before the fix
 * the engine loop's next step hit `enqueue on closed stream 'compute.r0'` and the process died of that unhandled
 * rejection (exit 1, the thread's reason nowhere but in the failed request's answer).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { EXIT_LAST_RANK_PREFIX } from '../worker/kernels_testkit.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const INSTANCE = new URL('./instance.ts', import.meta.url).href;
const KERNELS = new URL('../worker/kernels_testkit.ts', import.meta.url).href;
const ENV = new URL('../util/env.ts', import.meta.url).href;

/** The child: one instance, one request that kills rank 1, /health, a later request, then shutdown. */
const CHILD = `
import { DEFAULT_INSTANCE_OPTIONS, startInstance } from '${INSTANCE}';
import { RealEnv } from '${ENV}';
const inst = await startInstance({ ...DEFAULT_INSTANCE_OPTIONS, preset: 'llama-mini', port: 0, numBlocks: 64,
  tensorParallelSize: 2, scheduler: { maxModelLen: 256 }, kernelModuleUrl: '${KERNELS}' }, new RealEnv(4));
const post = async (id) => {
  const r = await fetch(inst.url + '/v1/completions', { method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': id },
    body: JSON.stringify({ prompt: 'The KV cache moved', max_tokens: 4, temperature: 0, ignore_eos: true }) });
  return { status: r.status, body: await r.json() };
};
const out = { dying: await post('${EXIT_LAST_RANK_PREFIX}1') };
for (let k = 0; k < 100; k++) {
  const h = await fetch(inst.url + '/health');
  out.health = { status: h.status, body: await h.json() };
  if (h.status !== 200) break;
  await new Promise((r) => setImmediate(r));
}
out.later = await post('later');
out.drained = await inst.drainAndClose(5000);
process.stdout.write(JSON.stringify(out) + '\\n');
`;

interface Answer {
  status: number;
  body: { error?: { code: string; type: string; message: string } };
}

test('TP=2 serving: a rank thread that dies gives 500s and /health 503 with its reason; the process then exits cleanly', () => {
  // A file, not `-e`: the compute threads inherit the process's exec flags, and `--input-type` fails them.
  const dir = mkdtempSync(join(tmpdir(), 'rank-death-'));
  const script = join(dir, 'child.mjs');
  writeFileSync(script, CHILD);
  const r = spawnSync(process.execPath, ['--import', 'tsx', script], {
    cwd: ROOT,
    encoding: 'utf8',
    timeout: 90_000,
    input: '',
    env: { ...process.env, HANDOFF_LOG_LEVEL: 'silent' },
  });
  rmSync(dir, { recursive: true, force: true });
  const tail = `stdout: ${r.stdout.slice(-600)} stderr: ${r.stderr.slice(-1200)}`;
  assert.notEqual(r.status, null, `the process still ran after 90 s (a thread kept it alive); ${tail}`);
  assert.equal(r.status, 0, `the process exited on its own, with 0; ${tail}`);
  const out = JSON.parse(r.stdout.trim().split('\n').at(-1) ?? '{}') as Record<string, Answer>;
  const reason = /compute thread 1 exited \(code 9\)/;
  for (const what of ['dying', 'health', 'later'] as const) {
    const a = out[what] as Answer;
    assert.equal(a.status, what === 'health' ? 503 : 500, `${what}: ${JSON.stringify(a)}`);
    assert.equal(a.body.error?.code, 'INTERNAL', what);
    assert.equal(a.body.error?.type, 'server_error', what);
    assert.match(a.body.error?.message ?? '', reason, what);
  }
});
