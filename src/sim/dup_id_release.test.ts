/**
 * A decode request that repeats the X-Request-Id of a live READ request with the same
 * kv_transfer_params (a client or proxy retry) is refused as a duplicate, and the refusal released the
 * transfer it names: prefill freed the pages the live request was about to READ, which then failed.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RealEnv } from '../util/env.ts';
import { threadedDevice } from '../engine/devices.ts';
import { LLMEngine, type GenerateRequest } from '../engine/llm_engine.ts';
import { PdPair } from './pd_pair.ts';

const env = new RealEnv(4);

test('a refused duplicate of a live READ request (same id, same params) leaves the live request unharmed', async () => {
  const prompt: GenerateRequest = {
    promptTokenIds: Array.from({ length: 47 }, (_, k) => (977 + k * 31) % 50000),
    sampling: { maxTokens: 4, ignoreEos: true },
  };
  const ref = await LLMEngine.create(
    {
      preset: 'dsv4-mini',
      modelSeed: 2,
      numBlocks: 128,
      asyncScheduling: true,
      scheduler: {},
      idlePollMs: 2,
      makeDevice: threadedDevice('dsv4-mini', 2),
    },
    env,
  );
  const want = (await ref.generate(prompt)).tokenIds;
  await ref.close();
  const pair = await PdPair.create(
    { preset: 'dsv4-mini', modelSeed: 2, numBlocks: 128, decode: {}, raceCheck: false, name: 'dup-read' },
    env,
  );
  try {
    // The prefill leg, as the proxy runs it.
    const p = await pair.prefill.generate({
      ...prompt,
      sampling: { ...prompt.sampling, maxTokens: 1 },
      kvTransferParams: { do_remote_decode: true, do_remote_prefill: false, transfer_id: 'dup-xfer' },
    });
    const params = {
      ...(p.kvTransferParams as Record<string, unknown>),
      do_remote_prefill: true,
      do_remote_decode: false,
    };
    const first = pair.decode.generate({ ...prompt, requestId: 'dup-1', kvTransferParams: { ...params } as never });
    // The retry, while the first is live: refused as a duplicate id.
    await assert.rejects(
      pair.decode.generate({ ...prompt, requestId: 'dup-1', kvTransferParams: { ...params } as never }),
      /duplicate request id/,
    );
    const got = await first.then(
      (r) => ({ tokens: r.tokenIds, external: r.numExternalTokens }),
      (e: Error & { code?: string }) => ({ error: `${e.code}: ${e.message}` }),
    );
    assert.deepEqual(got, { tokens: want, external: 46 });
  } finally {
    await pair.close();
  }
});
