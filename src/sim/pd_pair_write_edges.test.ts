/**
 * WRITE-mode decode edges, on real engines: two live requests naming one transfer id (client-supplied
 * params, or a retry) get the second refused with 400 BAD_TRANSFER_PARAMS while the first loads and the
 * engine keeps serving (the worker keys WRITE loads by transfer id: a duplicate crashed the engine loop);
 * a load aborted while parked in WAITING_FOR_REMOTE_KVS gives its pages back once the worker fenced it,
 * for a kv_consumer and for a kv_both decode alike (kv_both dropped the worker's report: pages leaked).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { DEFAULT_ONE_SIDED_CONFIG, type OneSidedConfig } from '../connector/config.ts';
import { buildInstance } from '../engine/build_instance.ts';
import { threadedDevice } from '../engine/devices.ts';
import type { GenerateRequest } from '../engine/llm_engine.ts';
import { decodeParamsWrite } from '../serve/pd_flow.ts';
import { PdPair } from './pd_pair.ts';

const env = new RealEnv(4);

test('WRITE decode: a second live request under one transfer id is refused with 400; the first loads, the engine keeps serving', async () => {
  const pair = await PdPair.create(
    {
      preset: 'dsv4-mini',
      modelSeed: 2,
      numBlocks: 128,
      decode: { mode: 'write', transferTimeoutMs: 300 },
      raceCheck: false,
      name: 'dup-write',
    },
    env,
  );
  try {
    const addr = pair.prefillConnector.transfer.address();
    const params = decodeParamsWrite(
      {
        engineId: pair.prefillConnector.transfer.engineId,
        sideChannelHost: addr.host,
        sideChannelPort: addr.port,
        transferMode: 'write',
      },
      'dup-transfer',
    );
    const g = (id: string): GenerateRequest => ({
      requestId: id,
      promptTokenIds: Array.from({ length: 40 }, (_, k) => (k * 31) % 50000),
      sampling: { maxTokens: 2, ignoreEos: true },
      kvTransferParams: { ...params },
    });
    const settle = (p: Promise<unknown>): Promise<string> =>
      p.then(
        () => 'ok',
        (e: Error & { code?: string }) => `${e.code ?? ''}`,
      );
    // Same transfer id, different request ids, submitted in the same step; nobody pushes (the first
    // times out and is recomputed).
    const results = await Promise.all([settle(pair.decode.generate(g('a'))), settle(pair.decode.generate(g('b')))]);
    assert.equal(pair.decode.core.crashed, null, `decode engine loop crashed: ${pair.decode.core.crashed?.message}`);
    assert.deepEqual([...results].sort(), ['BAD_TRANSFER_PARAMS', 'ok']);
    const after = await settle(
      pair.decode.generate({ promptTokenIds: [1, 2, 3, 4, 5], sampling: { maxTokens: 2, ignoreEos: true } }),
    );
    assert.equal(after, 'ok', 'decode keeps serving');
  } finally {
    await pair.close();
  }
});

async function run(decodeRole: OneSidedConfig['role'], name: string): Promise<{ free: number; idle: boolean }> {
  const build = (role: OneSidedConfig['role'], tag: string) =>
    buildInstance(
      {
        preset: 'dsv4-mini',
        modelSeed: 2,
        numBlocks: 64,
        tensorParallelSize: 1,
        asyncScheduling: true,
        scheduler: {},
        idlePollMs: 2,
        makeDevice: threadedDevice('dsv4-mini', 2, false),
        connector: {
          config: { ...DEFAULT_ONE_SIDED_CONFIG, mode: 'write', role, transferTimeoutMs: 60_000 },
          endpoint: { backend: 'inproc', engineId: `${name}-${tag}`, modelName: 'dsv4-mini', preset: 'dsv4-mini' },
        },
      },
      env,
    );
  const prefill = await build('producer', 'p');
  const decode = await build(decodeRole, 'd');
  try {
    const conn = prefill.connector!;
    const addr = conn.transfer.address();
    const params = decodeParamsWrite(
      {
        engineId: conn.transfer.engineId,
        sideChannelHost: addr.host,
        sideChannelPort: addr.port,
        transferMode: 'write',
      },
      `${name}-t`,
    );
    const done = decode.engine
      .generate({
        requestId: `${name}-r`,
        promptTokenIds: Array.from({ length: 40 }, (_, k) => (k * 31) % 50000),
        sampling: { maxTokens: 2, ignoreEos: true },
        kvTransferParams: params,
      })
      .catch((e: Error) => e);
    // Wait until it is parked for the WRITE (prefill never computes it: the push never comes).
    for (let k = 0; k < 400 && decode.engine.kv.getNumFreeBlocks() === 63; k++) await env.sleep(5);
    assert.ok(decode.engine.kv.getNumFreeBlocks() < 63, 'pages allocated for the WRITE load');
    await env.sleep(50);
    decode.engine.abort(`${name}-r`);
    await done;
    for (let k = 0; k < 200 && !decode.engine.core.isIdle(); k++) await env.sleep(5);
    return { free: decode.engine.kv.getNumFreeBlocks(), idle: decode.engine.core.isIdle() };
  } finally {
    await decode.engine.close();
    await prefill.engine.close();
  }
}

for (const role of ['consumer', 'both'] as const) {
  test(`WRITE decode (kv_${role}): a load aborted while parked gives its pages back once fenced`, async () => {
    assert.deepEqual(await run(role, `abort-${role}`), { free: 63, idle: true });
  });
}
