/**
 * `handoff up --tensor-parallel-size 2` as a user runs it: prefill and decode each split over two
 * compute threads (own KV slabs per rank), the KV moving between the processes over tcp rank by rank;
 * the quickstart prompt gives the same text as `handoff up` at TP=1 (the split changes no bit). With
 * `--prefill-tp 1 --decode-tp 2` each decode rank reads its head slice of the prefill's pages: the same
 * text again, one READ on decode's /metrics and no load failure; a degree that divides nothing is refused
 * before anything starts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { RealEnv } from '../../src/util/env.ts';
import { HANDOFF_BIN } from '../../src/cli/children.ts';

const env = new RealEnv(4);

/** Start `handoff up` with `args`, send its printed curl request, stop it; the text and decode's /metrics. */
async function upRun(args: string[]): Promise<{ text: string; decodeMetrics: string }> {
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
    const decode = /decode\s+(http:\/\/\S+)/.exec(out);
    assert.ok(decode, `decode's address in:\n${out}`);
    const decodeMetrics = await (await fetch(`${decode[1]}/metrics`)).text();
    process.kill(-(up.pid as number), 'SIGINT');
    assert.equal(await exited, 0);
    return { text: j.choices[0]?.text ?? '', decodeMetrics };
  } finally {
    if (up.exitCode === null) process.kill(-(up.pid as number), 'SIGKILL');
  }
}

const upAnswer = async (args: string[]): Promise<string> => (await upRun(args)).text;

/** A decode counter's value on its /metrics (0 when absent). */
function counter(metrics: string, name: string): number {
  const m = new RegExp(`^${name}\\{[^}]*\\} (\\S+)$`, 'm').exec(metrics);
  return m ? Number(m[1]) : 0;
}

test('handoff up --tensor-parallel-size 2 and --prefill-tp 1 --decode-tp 2: the quickstart text of TP=1', async () => {
  const one = await upAnswer([]);
  const two = await upAnswer(['--tensor-parallel-size', '2']);
  assert.ok(two.length > 0);
  assert.equal(two, one);
  const mixed = await upRun(['--prefill-tp', '1', '--decode-tp', '2']);
  assert.equal(mixed.text, one, 'each decode rank read its head slice of the TP=1 prefill pages');
  assert.equal(counter(mixed.decodeMetrics, 'handoff_transfer_reads_total'), 1);
  assert.ok(counter(mixed.decodeMetrics, 'handoff_transfer_bytes_read_total') > 0);
  assert.equal(counter(mixed.decodeMetrics, 'handoff_kv_load_failures_total'), 0);
});

test('handoff up --decode-tp 3: refused with BAD_CONFIG before any child starts', () => {
  const r = spawnSync(process.execPath, [HANDOFF_BIN, 'up', '--port', '0', '--prefill-tp', '2', '--decode-tp', '3'], {
    encoding: 'utf8',
    timeout: 30_000,
  });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /BAD_CONFIG: --decode-tp must divide/);
  assert.doesNotMatch(r.stdout, /starting prefill/);
});
