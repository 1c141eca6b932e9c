/** CLI flag parsing: good values become typed options; bad ones are BAD_CONFIG naming the flag. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { HandoffError } from '../util/errors.ts';
import {
  anyPresetFlag,
  blockSizeFlag,
  intFlag,
  logFormatFlag,
  pdTensorParallelFlags,
  presetFlag,
  rangeFlag,
  urlListFlag,
} from './flags.ts';
import { upRoleServeArgs, upServeArgs } from './up.ts';
import { serveArgs } from './cluster.ts';
import { parseKvTransferConfig } from '../connector/config.ts';
import { proxyOptionsFrom } from './proxy.ts';
import { serveOptionsFrom } from './serve.ts';

const names =
  (flag: string) =>
  (e: unknown): boolean =>
    e instanceof HandoffError && e.code === 'BAD_CONFIG' && e.message.includes(`--${flag}`);

test('numbers, ranges and URL lists', () => {
  assert.equal(intFlag('n', '12', 1, 20), 12);
  assert.throws(() => intFlag('n', '1.5', 1, 20), names('n'));
  assert.throws(() => intFlag('n', '', 1, 20), names('n'));
  assert.throws(() => intFlag('n', '21', 1, 20), names('n'));
  assert.deepEqual(rangeFlag('r', '3:9', 1, 100), [3, 9]);
  assert.deepEqual(rangeFlag('r', '7', 1, 100), [7, 7]);
  assert.throws(() => rangeFlag('r', '9:3', 1, 100), names('r'));
  assert.deepEqual(urlListFlag('decode', 'http://a:1/, http://b:2'), ['http://a:1', 'http://b:2']);
  assert.throws(() => urlListFlag('decode', 'http://a:1,http://a:1'), names('decode'));
  assert.throws(() => urlListFlag('decode', 'ftp://a'), names('decode'));
  assert.throws(() => urlListFlag('decode', ''), names('decode'));
});

function serveBase(): Record<string, string> {
  return {
    role: 'decode',
    model: 'llama-mini',
    host: '0.0.0.0',
    port: '0',
    numBlocks: '64',
    blockSize: '16',
    transferPort: '0',
    transferDataPort: '0',
    seed: '3',
  };
}

test('serve and proxy options from commander values', () => {
  const base = serveBase();
  const s = serveOptionsFrom({ ...base, maxModelLen: '256', apiKey: 'k' });
  assert.equal(s.role, 'decode');
  assert.equal(s.preset, 'llama-mini');
  assert.equal(s.transferHost, '127.0.0.1', 'a wildcard HTTP host advertises loopback for KV unless told');
  assert.deepEqual(s.scheduler, { maxModelLen: 256 });
  assert.equal(s.apiKey, 'k');
  assert.throws(() => serveOptionsFrom({ ...base, model: 'gpt-5' }), names('model'));
  assert.throws(() => serveOptionsFrom({ ...base, maxNumSeqs: '0' }), names('max-num-seqs'));
  const p = proxyOptionsFrom({
    prefill: 'http://p:1',
    decode: 'http://d:1,http://d:2',
    mode: 'write',
    policy: 'least-loaded',
    healthIntervalMs: '500',
    healthTimeoutMs: '100',
  });
  assert.deepEqual([p.mode, p.policy, p.decodeUrls.length], ['write', 'least-loaded', 2]);
  assert.throws(
    () =>
      proxyOptionsFrom({
        prefill: 'http://p:1',
        decode: 'http://d:1',
        mode: 'sideways',
        policy: 'round-robin',
        healthIntervalMs: '500',
        healthTimeoutMs: '100',
      }),
    names('mode'),
  );
});

test('--log-format accepts pretty|json, absent means automatic, anything else is BAD_CONFIG naming the flag', () => {
  assert.equal(logFormatFlag('pretty'), 'pretty');
  assert.equal(logFormatFlag('json'), 'json');
  assert.equal(logFormatFlag(undefined), null);
  assert.throws(() => logFormatFlag('xml'), names('log-format'));
});

test('up passes its log format to prefill and decode explicitly (they cannot tell how up chose)', () => {
  assert.deepEqual(upServeArgs({}, 'pretty'), ['--log-format', 'pretty']);
  assert.deepEqual(upServeArgs({ numBlocks: '64' }, 'json'), ['--num-blocks', '64', '--log-format', 'json']);
});

test('--model: serving commands refuse the micro presets (no tokenizer for a 64-token vocabulary); sim takes them', () => {
  assert.equal(presetFlag('dsv4-mini'), 'dsv4-mini');
  assert.throws(
    () => presetFlag('dsv4-micro'),
    (e: unknown) => e instanceof HandoffError && e.code === 'BAD_CONFIG' && /simulator preset/.test(e.message),
  );
  assert.throws(
    () => presetFlag('gpt-5'),
    (e: unknown) => e instanceof HandoffError && e.code === 'BAD_CONFIG',
  );
  assert.equal(anyPresetFlag('hybrid-micro'), 'hybrid-micro');
  assert.throws(
    () => anyPresetFlag('dsv4'),
    (e: unknown) => e instanceof HandoffError && e.code === 'BAD_CONFIG',
  );
});

test('--block-size: a power of two in [1, 256]; anything else is BAD_CONFIG naming the flag', () => {
  for (const ok of ['1', '8', '16', '256']) assert.equal(blockSizeFlag(ok), Number(ok));
  for (const bad of ['0', '12', '512', '-16', 'x', '8.5'])
    assert.throws(
      () => blockSizeFlag(bad),
      (e: unknown) => e instanceof HandoffError && e.code === 'BAD_CONFIG' && /--block-size/.test(e.message),
      bad,
    );
  assert.equal(serveOptionsFrom({ ...serveBase(), blockSize: '32' }).blockSize, 32);
});

test('up: --block-size sets both children, --prefill-block-size / --decode-block-size one each (they win); a bad one names its flag', () => {
  assert.deepEqual(upRoleServeArgs({}), { prefill: [], decode: [] });
  assert.deepEqual(upRoleServeArgs({ blockSize: '8' }), {
    prefill: ['--block-size', '8'],
    decode: ['--block-size', '8'],
  });
  assert.deepEqual(upRoleServeArgs({ blockSize: '8', decodeBlockSize: '32' }), {
    prefill: ['--block-size', '8'],
    decode: ['--block-size', '32'],
  });
  assert.deepEqual(upRoleServeArgs({ prefillBlockSize: '32', decodeBlockSize: '8' }), {
    prefill: ['--block-size', '32'],
    decode: ['--block-size', '8'],
  });
  assert.throws(() => upRoleServeArgs({ decodeBlockSize: '24' }), names('decode-block-size'));
  assert.deepEqual(
    serveArgs('decode', {
      preset: 'dsv4-mini',
      mode: 'read',
      host: '127.0.0.1',
      serveArgs: ['--num-blocks', '64'],
      roleServeArgs: upRoleServeArgs({ prefillBlockSize: '32', decodeBlockSize: '8' }),
    }).slice(9, 13),
    ['--num-blocks', '64', '--block-size', '8'],
  );
});

test('--tensor-parallel-size: 1 or 2 (divides the KV heads and the shards); --prefill-tp/--decode-tp may differ', () => {
  assert.equal(serveOptionsFrom({ ...serveBase(), tensorParallelSize: '2' }).tensorParallelSize, 2);
  assert.equal(serveOptionsFrom(serveBase()).tensorParallelSize, 1);
  for (const bad of ['0', '3', '4', 'x', '1.5'])
    assert.throws(() => serveOptionsFrom({ ...serveBase(), tensorParallelSize: bad }), names('tensor-parallel-size'));
  assert.deepEqual(pdTensorParallelFlags('dsv4-mini', {}), { prefill: 1, decode: 1 });
  assert.deepEqual(pdTensorParallelFlags('dsv4-mini', { tensorParallelSize: '2' }), { prefill: 2, decode: 2 });
  assert.deepEqual(pdTensorParallelFlags('llama-mini', { prefillTp: '2', decodeTp: '2' }), { prefill: 2, decode: 2 });
  assert.throws(() => pdTensorParallelFlags('llama-mini', { decodeTp: '3' }), names('decode-tp'));
  assert.deepEqual(pdTensorParallelFlags('llama-mini', { prefillTp: '2', decodeTp: '1' }), { prefill: 2, decode: 1 });
  assert.deepEqual(pdTensorParallelFlags('hybrid-mini', { tensorParallelSize: '2', prefillTp: '1' }), {
    prefill: 1,
    decode: 2,
  });
});

test('READ loads: decode’s kv_transfer_config names async_read (true unless asked otherwise), prefill’s never; serving defaults to async', () => {
  const cfg = (role: 'prefill' | 'decode', asyncRead?: boolean, mode: 'read' | 'write' = 'read') => {
    const args = serveArgs(role, { preset: 'dsv4-mini', mode, host: '127.0.0.1', serveArgs: [], asyncRead });
    return JSON.parse(args[args.indexOf('--kv-transfer-config') + 1] as string).kv_connector_extra_config;
  };
  assert.deepEqual(cfg('decode', true), { read_mode: true, async_read: true });
  assert.deepEqual(cfg('decode'), { read_mode: true, async_read: true });
  assert.deepEqual(cfg('decode', false), { read_mode: true, async_read: false });
  assert.deepEqual(cfg('prefill', true), { read_mode: true });
  assert.deepEqual(cfg('decode', true, 'write'), { read_mode: false });
  const parsed = (extra: object) =>
    parseKvTransferConfig({ kv_role: 'kv_consumer', kv_connector_extra_config: extra }).config.asyncRead;
  assert.equal(parsed(cfg('decode', false)), false);
  assert.equal(parsed(cfg('decode')), true);
  // vLLM's NIXL connector loads asynchronously: so does a consumer that does not say (READ mode).
  assert.equal(parsed({}), true);
  assert.equal(parsed({ read_mode: true }), true);
  assert.equal(parsed({ read_mode: false }), false);
  assert.equal(parsed({ async_read: 'false' }), false);
});
