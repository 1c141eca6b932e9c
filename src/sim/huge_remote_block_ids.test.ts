/**
 * remote_block_ids far past the producer's pool (the edge accepts any safe integer) must fail that
 * request alone with 400 BAD_TRANSFER_PARAMS; the decode instance keeps serving. Before: decode turned
 * each id into a byte offset in prefill's slab (id * page bytes), which for ids past ~2^53 / page bytes is
 * no safe integer; the transfer engine's assertion on it ("bad remote offset ...") threw inside the
 * engine step, which crashed decode's engine loop for every request, and its process.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { isHandoffError } from '../util/errors.ts';
import { PdPair } from './pd_pair.ts';

const env = new RealEnv(11);
const prompt = (seed: number, n: number): number[] => Array.from({ length: n }, (_, k) => (seed * 977 + k * 31) % 60);
const sampling = { maxTokens: 3, temperature: 0, ignoreEos: true };

for (const [what, idOf] of [
  ['ids near 2^53', (i: number) => Number.MAX_SAFE_INTEGER - i],
  ['ids of 2^50', (i: number) => 2 ** 50 + i],
] as const) {
  test(`remote_block_ids ${what}: the request fails alone (400), decode keeps serving`, async () => {
    const pair = await PdPair.create(
      { preset: 'llama-micro', modelSeed: 2, numBlocks: 64, decode: {}, raceCheck: false, name: `huge-ids-${what}` },
      env,
    );
    pair.decode.core.reportCrashesViaCrashed();
    try {
      const ask = { do_remote_decode: true, do_remote_prefill: false, transfer_id: 'xfer-huge' };
      const pre = await pair.prefill.generate({
        promptTokenIds: prompt(1, 40),
        sampling: { ...sampling, maxTokens: 1 },
        kvTransferParams: ask,
      });
      const p: Record<string, unknown> = { ...pre.kvTransferParams, do_remote_prefill: true, do_remote_decode: false };
      const ids = (p['remote_block_ids'] as number[][]).map((g) => g.map((_, i) => idOf(i)));
      let error: unknown = null;
      try {
        await pair.decode.generate({
          promptTokenIds: prompt(1, 40),
          sampling,
          kvTransferParams: { ...p, remote_block_ids: ids },
        });
      } catch (e) {
        error = e;
      }
      assert.equal(
        pair.decode.core.crashed,
        null,
        `decode's engine loop is alive (${pair.decode.core.crashed?.message})`,
      );
      assert.ok(isHandoffError(error), `the request fails with an operating error, got ${String(error)}`);
      assert.equal(error.code, 'BAD_TRANSFER_PARAMS');
      // Decode still serves, locally and over P/D.
      const next = await pair.prefill.generate({
        promptTokenIds: prompt(2, 40),
        sampling: { ...sampling, maxTokens: 1 },
        kvTransferParams: { ...ask, transfer_id: 'xfer-next' },
      });
      const params = { ...next.kvTransferParams, do_remote_prefill: true, do_remote_decode: false };
      const pd = await pair.decode.generate({ promptTokenIds: prompt(2, 40), sampling, kvTransferParams: params });
      const local = await pair.decode.generate({ promptTokenIds: prompt(2, 40), sampling });
      assert.equal(pd.numExternalTokens, 39);
      assert.deepEqual(pd.tokenIds, local.tokenIds);
    } finally {
      await pair.close().catch(() => undefined);
    }
  });
}
