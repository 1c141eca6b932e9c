/**
 * A prefill request naming a transfer_id that another request's pages are already held under (a client
 * reusing or guessing it) must be refused alone (400 BAD_TRANSFER_PARAMS); the first request's transfer
 * must go on. Before: the second prefill re-issued the grant under the same transfer_id, revoking the
 * first's, so the first client's decode failed with GRANT_DENIED (a 4xx for a request that did nothing
 * wrong), and the producer worker's table tied the transfer to the wrong request.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { isHandoffError } from '../util/errors.ts';
import type { GenerateRequest } from '../engine/llm_engine.ts';
import { PdPair } from './pd_pair.ts';

const env = new RealEnv(7);
const prompt = (seed: number, n: number): number[] => Array.from({ length: n }, (_, k) => (seed * 977 + k * 31) % 60);
const sampling = { maxTokens: 4, temperature: 0, ignoreEos: true };

test('a second prefill under a held transfer_id is refused; the first transfer is untouched', async () => {
  const pair = await PdPair.create(
    { preset: 'llama-micro', modelSeed: 2, numBlocks: 64, decode: {}, raceCheck: false, name: 'dup-xfer' },
    env,
  );
  try {
    const a: GenerateRequest = { promptTokenIds: prompt(1, 40), sampling };
    const ask = { do_remote_decode: true, do_remote_prefill: false, transfer_id: 'xfer-shared' };
    const pa = await pair.prefill.generate({
      requestId: 'pa',
      promptTokenIds: a.promptTokenIds,
      sampling: { ...sampling, maxTokens: 1 },
      kvTransferParams: { ...ask },
    });
    // Another client names the same transfer_id while A's pages are held for A's decode.
    let refused: unknown = null;
    try {
      await pair.prefill.generate({
        requestId: 'pb',
        promptTokenIds: prompt(2, 33),
        sampling: { ...sampling, maxTokens: 1 },
        kvTransferParams: { ...ask },
      });
    } catch (e) {
      refused = e;
    }
    // A's decode still reads A's pages and answers as colocated would.
    const params = { ...pa.kvTransferParams, do_remote_prefill: true, do_remote_decode: false };
    const got = await pair.decode.generate({ ...a, requestId: 'da', kvTransferParams: params });
    assert.ok(isHandoffError(refused), `the duplicate is refused, got ${String(refused)}`);
    assert.equal(refused.code, 'BAD_TRANSFER_PARAMS');
    assert.equal(got.numExternalTokens, 39, 'decode loaded the prompt from prefill');
    const local = await pair.decode.generate({ ...a, requestId: 'local' });
    assert.deepEqual(got.tokenIds, local.tokenIds);
  } finally {
    await pair.close();
  }
});

test('two live prefills under one transfer_id: the second is refused, the first transfer goes on', async () => {
  const pair = await PdPair.create(
    { preset: 'llama-micro', modelSeed: 2, numBlocks: 64, decode: {}, raceCheck: false, name: 'dup-xfer-live' },
    env,
  );
  try {
    const a: GenerateRequest = { promptTokenIds: prompt(3, 40), sampling };
    const ask = { do_remote_decode: true, do_remote_prefill: false, transfer_id: 'xfer-live' };
    // Both submitted before either finishes: nothing is held yet when the second arrives.
    const pa = pair.prefill.generate({
      requestId: 'pa',
      promptTokenIds: a.promptTokenIds,
      sampling: { ...sampling, maxTokens: 1 },
      kvTransferParams: { ...ask },
    });
    const pb = pair.prefill
      .generate({
        requestId: 'pb',
        promptTokenIds: prompt(4, 33),
        sampling: { ...sampling, maxTokens: 1 },
        kvTransferParams: { ...ask },
      })
      .then(
        () => null,
        (e: unknown) => e,
      );
    const [ra, refused] = await Promise.all([pa, pb]);
    const params = { ...ra.kvTransferParams, do_remote_prefill: true, do_remote_decode: false };
    const got = await pair.decode.generate({ ...a, requestId: 'da', kvTransferParams: params });
    assert.ok(isHandoffError(refused), `the duplicate is refused, got ${String(refused)}`);
    assert.equal(refused.code, 'BAD_TRANSFER_PARAMS');
    const local = await pair.decode.generate({ ...a, requestId: 'local' });
    assert.deepEqual(got.tokenIds, local.tokenIds);
  } finally {
    await pair.close();
  }
});
