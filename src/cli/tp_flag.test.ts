/**
 * The tensor parallel flags (`--tensor-parallel-size`, `--prefill-tp`, `--decode-tp`) take plain decimal
 * integers like every other integer flag: '0x2', '2.0', '2e0', '02' and '+2' were read as 2 (Number() of the
 * text) and the instance started at TP=2, where the README promises a BAD_CONFIG naming the flag.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { HandoffError } from '../util/errors.ts';
import { HANDOFF_BIN } from './children.ts';
import { pdTensorParallelFlags, tensorParallelFlag } from './flags.ts';

const BAD = ['0x2', '2.0', '2e0', '02', '+2', '0b10'];

const badConfig = (flag: string) => (e: unknown) =>
  e instanceof HandoffError && e.code === 'BAD_CONFIG' && e.message.includes(`--${flag} `);

test('--tensor-parallel-size / --prefill-tp / --decode-tp: only plain decimal integers', () => {
  for (const v of BAD) {
    assert.throws(() => tensorParallelFlag('llama-mini', v), badConfig('tensor-parallel-size'), v);
    assert.throws(() => pdTensorParallelFlags('dsv4-mini', { prefillTp: v }), badConfig('prefill-tp'), v);
    assert.throws(() => pdTensorParallelFlags('hybrid-mini', { decodeTp: v }), badConfig('decode-tp'), v);
  }
  assert.equal(tensorParallelFlag('llama-mini', ' 2 '), 2);
  assert.equal(tensorParallelFlag('llama-mini', undefined), 1);
  assert.deepEqual(pdTensorParallelFlags('dsv4-mini', { prefillTp: '2', decodeTp: '1' }), { prefill: 2, decode: 1 });
});

test('handoff serve --tensor-parallel-size 0x2 is refused before it starts', () => {
  const r = spawnSync(
    process.execPath,
    [HANDOFF_BIN, 'serve', '--port', '0', '--json', '--exit-with-parent', '--tensor-parallel-size', '0x2'],
    { encoding: 'utf8', timeout: 30_000, input: '', env: { ...process.env, HANDOFF_LOG_LEVEL: 'error' } },
  );
  assert.equal(r.status, 1, `stdout: ${r.stdout.slice(0, 300)}`);
  assert.match(r.stderr, /handoff: BAD_CONFIG: --tensor-parallel-size must divide/);
  assert.equal(r.stdout, '', 'no ready line');
});
