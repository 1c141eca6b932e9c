/**
 * `handoff up --tensor-parallel-size 2` as a user runs it: prefill and decode each split over two
 * compute threads (own KV slabs per rank), the KV moving between the processes over tcp rank by rank;
 * the quickstart prompt gives the same text as `handoff up` at TP=1 (the split changes no bit), and
 * unequal degrees are refused before anything starts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { RealEnv } from '../../src/util/env.ts';
import { HANDOFF_BIN } from '../../src/cli/children.ts';

const env = new RealEnv(4);

/** Start `handoff up` with `args`, send its printed curl request, stop it; returns the completion text. */
async function upAnswer(args: string[]): Promise<string> {
  const childEnv: NodeJS.ProcessEnv = { ...process.env };
  delete childEnv['NODE_TEST_CONTEXT'];
  const up = spawn(process.execPath, [HANDOFF_BIN, 'up', '--port', '0', '--model', 'llama-mini', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: childEnv,
    detached: true,
  });
  const exited = new Promise<number | null>((resolve) => up.once('exit', (code) => resolve(code)));
  let out = '';
  try {
    await new Promise<void>((resolve, reject) => {
      const timer = env.setTimer(90_000, () => reject(new Error(`not ready: ${out}`)));
      up.stdout.setEncoding('utf8').on('data', (s: string) => {
        out += s;
        if (out.includes('Ctrl-C stops everything')) (timer.cancel(), resolve());
      });
      void exited.then((code) => reject(new Error(`exited early (${code}): ${out}`)));
    });
    const curl = /curl -s (\S+) -H 'Content-Type: application\/json' -d '(.+)'/.exec(out);
    assert.ok(curl, `a curl line in:\n${out}`);
    const r = await fetch(curl[1]!, { method: 'POST', headers: { 'content-type': 'application/json' }, body: curl[2] });
    assert.equal(r.status, 200);
    const j = (await r.json()) as { choices: Array<{ text: string }>; usage: { completion_tokens: number } };
    assert.equal(j.usage.completion_tokens, 16);
    process.kill(-(up.pid as number), 'SIGINT');
    assert.equal(await exited, 0);
    return j.choices[0]?.text ?? '';
  } finally {
    if (up.exitCode === null) process.kill(-(up.pid as number), 'SIGKILL');
  }
}

test('handoff up --tensor-parallel-size 2: ready, answers the quickstart prompt with the text of TP=1', async () => {
  const two = await upAnswer(['--tensor-parallel-size', '2']);
  const one = await upAnswer([]);
  assert.ok(two.length > 0);
  assert.equal(two, one);
});

test('handoff up --prefill-tp 2 --decode-tp 1: refused with BAD_CONFIG before any child starts', () => {
  const r = spawnSync(process.execPath, [HANDOFF_BIN, 'up', '--port', '0', '--prefill-tp', '2', '--decode-tp', '1'], {
    encoding: 'utf8',
    timeout: 30_000,
  });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /BAD_CONFIG: --prefill-tp 2 and --decode-tp 1 differ/);
  assert.doesNotMatch(r.stdout, /starting prefill/);
});
